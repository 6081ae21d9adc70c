/* calibrate — simplex-constrained least-squares head mixing (see calibrate.h). */
#include "calibrate.h"
#include "calibrate_out.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "mapflow_kernels.h"
#include "mf_profile.h"
#include "ref_util.h"

/* Block masses are kept at this granularity; any profile block size (a power of two ≥ 8)
 * is a union of these blocks. */
#define BASE_BLOCK 8u

/* Target Top-P values tried per mask head with per_head_top_p (ascending). */
static const double topp_grid[] = { 0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 0.925, 0.95,
                                    0.975, 0.99, 1.0 };
#define N_GRID (sizeof topp_grid / sizeof topp_grid[0])

struct mf_calib {
    uint32_t ls, hs, lt, ht;
    uint64_t n_seq;
    double *gram;      /* [ls][hs][hs]  Σ S_a·S_b */
    double *cross;     /* [lt][ls][ht][hs]  Σ T_h·S_s */
    double *tnorm;     /* [lt][ht]  Σ T_h² */
    mf_calib_out_t *out; /* the OUTPUTS objective's statistics (NULL until fed) */
    /* Block masses per sequence (mask recall): bm[q] = [(ls·hs + lt·ht)][tri(nb8[q])],
     * source heads first; entry (a, b ≤ a) at a(a+1)/2 + b = Σ of the map over query
     * block a × key block b (causal part). Grows with the sample count (≈ 1/128 of the maps). */
    float **bm;
    uint32_t *bm_nb;
    uint64_t bm_cap;
    /* results */
    int fitted;
    int objective;         /* the last fit's mf_calib_objective_t */
    uint32_t l0;
    uint32_t *src_layer;   /* [lt] */
    double *err;           /* [lt] */
    double *w;             /* [lt][ht][hs] */
    double *herr;          /* [lt][ht] */
    uint8_t *mode;         /* [lt][ht] */
    double *recall;        /* [lt][ht] */
    double *top_p;         /* [lt][ht] */
    double *src_err;       /* [lt][ls] */
    double *berr;          /* [lt] */
    double *bw;            /* [lt][ht][hs] */
    double *bherr;         /* [lt][ht] */
    uint8_t *bmode;        /* [lt][ht] */
    double *brecall;       /* [lt][ht] */
    double *btop_p;        /* [lt][ht] */
};

void mf_calib_destroy(mf_calib_t *c)
{
    if (!c)
        return;
    free(c->gram);
    free(c->cross);
    free(c->tnorm);
    mf_calib_out_destroy(c->out);
    for (uint64_t q = 0; q < c->n_seq && c->bm; q++)
        free(c->bm[q]);
    free(c->bm);
    free(c->bm_nb);
    free(c->src_layer);
    free(c->err);
    free(c->w);
    free(c->herr);
    free(c->mode);
    free(c->recall);
    free(c->top_p);
    free(c->src_err);
    free(c->berr);
    free(c->bw);
    free(c->bherr);
    free(c->bmode);
    free(c->brecall);
    free(c->btop_p);
    free(c);
}

mf_status_t mf_calib_create(uint32_t ls, uint32_t hs, uint32_t lt, uint32_t ht,
                            mf_calib_t **out)
{
    if (!out || ls < 1 || lt < 1 || ls > 1024 || lt > 1024 || hs < 1 || ht < 1 ||
        hs > MF_ROW_MAX_HEADS || ht > MF_ROW_MAX_HEADS)
        return MF_INVALID_ARGUMENT;
    mf_calib_t *c = calloc(1, sizeof(*c));
    if (!c)
        return MF_RESOURCE_EXHAUSTED;
    c->ls = ls;
    c->hs = hs;
    c->lt = lt;
    c->ht = ht;
    size_t whs = (size_t)lt * ht * hs;
    c->gram = calloc((size_t)ls * hs * hs, sizeof(double));
    c->cross = calloc((size_t)lt * ls * ht * hs, sizeof(double));
    c->tnorm = calloc((size_t)lt * ht, sizeof(double));
    c->src_layer = calloc(lt, sizeof(uint32_t));
    c->err = calloc(lt, sizeof(double));
    c->w = calloc(whs, sizeof(double));
    c->herr = calloc((size_t)lt * ht, sizeof(double));
    c->mode = calloc((size_t)lt * ht, 1);
    c->recall = calloc((size_t)lt * ht, sizeof(double));
    c->top_p = calloc((size_t)lt * ht, sizeof(double));
    c->brecall = calloc((size_t)lt * ht, sizeof(double));
    c->btop_p = calloc((size_t)lt * ht, sizeof(double));
    c->src_err = calloc((size_t)lt * ls, sizeof(double));
    c->berr = calloc(lt, sizeof(double));
    c->bw = calloc(whs, sizeof(double));
    c->bherr = calloc((size_t)lt * ht, sizeof(double));
    c->bmode = calloc((size_t)lt * ht, 1);
    if (!c->gram || !c->cross || !c->tnorm || !c->src_layer || !c->err || !c->w || !c->herr ||
        !c->mode || !c->src_err || !c->berr || !c->bw || !c->bherr || !c->bmode ||
        !c->recall || !c->top_p || !c->brecall || !c->btop_p) {
        mf_calib_destroy(c);
        return MF_RESOURCE_EXHAUSTED;
    }
    *out = c;
    return MF_OK;
}

/* Σ over the causal entries (k ≤ q) of a[q,k]·b[q,k] for two [n, n] maps. */
static double causal_dot(const float *a, const float *b, uint32_t n)
{
    double s = 0;
    for (uint32_t q = 0; q < n; q++)
        s += ref_dot(a + (size_t)q * n, b + (size_t)q * n, q + 1);
    return s;
}

/* Σ of map m [n, n] over query block a × key block b ≤ a (BASE_BLOCK), causal part. */
static float block_sum(const float *m, uint32_t n, uint32_t a, uint32_t b)
{
    double s = 0;
    for (uint32_t q = a * BASE_BLOCK; q < (a + 1) * BASE_BLOCK; q++) {
        uint32_t k1 = b == a ? q + 1 : (b + 1) * BASE_BLOCK;
        for (uint32_t k = b * BASE_BLOCK; k < k1; k++)
            s += m[(size_t)q * n + k];
    }
    return (float)s;
}

/* Keeps the block masses of one sequence (every source and target head). */
static mf_status_t add_block_masses(mf_calib_t *c, const float *src, const float *tgt,
                                    uint32_t n)
{
    if (c->n_seq == c->bm_cap) {
        uint64_t cap = c->bm_cap ? 2 * c->bm_cap : 16;
        float **bm = realloc(c->bm, cap * sizeof(*bm));
        if (!bm)
            return MF_RESOURCE_EXHAUSTED;
        c->bm = bm;
        uint32_t *nb = realloc(c->bm_nb, cap * sizeof(*nb));
        if (!nb)
            return MF_RESOURCE_EXHAUSTED;
        c->bm_nb = nb;
        c->bm_cap = cap;
    }
    uint32_t nb = n / BASE_BLOCK, heads = c->ls * c->hs + c->lt * c->ht;
    size_t tri = (size_t)nb * (nb + 1) / 2, nn = (size_t)n * n;
    float *bm = malloc((tri ? tri : 1) * heads * sizeof(float));
    if (!bm)
        return MF_RESOURCE_EXHAUSTED;
    for (uint32_t x = 0; x < heads; x++) {
        const float *m = x < c->ls * c->hs ? src + x * nn : tgt + (x - c->ls * c->hs) * nn;
        float *dst = bm + x * tri;
        for (uint32_t a = 0; a < nb; a++)
            for (uint32_t b = 0; b <= a; b++)
                dst[(size_t)a * (a + 1) / 2 + b] = block_sum(m, n, a, b);
    }
    c->bm[c->n_seq] = bm;
    c->bm_nb[c->n_seq] = nb;
    return MF_OK;
}

mf_status_t mf_calib_add(mf_calib_t *c, const float *src, const float *tgt, uint32_t n)
{
    if (!c || !src || !tgt || n < 1)
        return MF_INVALID_ARGUMENT;
    mf_status_t st = add_block_masses(c, src, tgt, n);
    if (st != MF_OK)
        return st;
    size_t nn = (size_t)n * n;
    for (uint32_t l = 0; l < c->ls; l++)
        for (uint32_t a = 0; a < c->hs; a++)
            for (uint32_t b = a; b < c->hs; b++) {
                double g = causal_dot(src + ((size_t)l * c->hs + a) * nn,
                                      src + ((size_t)l * c->hs + b) * nn, n);
                c->gram[((size_t)l * c->hs + a) * c->hs + b] += g;
                if (b != a)
                    c->gram[((size_t)l * c->hs + b) * c->hs + a] += g;
            }
    for (uint32_t t = 0; t < c->lt; t++)
        for (uint32_t h = 0; h < c->ht; h++) {
            const float *th = tgt + ((size_t)t * c->ht + h) * nn;
            c->tnorm[(size_t)t * c->ht + h] += causal_dot(th, th, n);
            for (uint32_t l = 0; l < c->ls; l++)
                for (uint32_t s = 0; s < c->hs; s++)
                    c->cross[(((size_t)t * c->ls + l) * c->ht + h) * c->hs + s] +=
                        causal_dot(th, src + ((size_t)l * c->hs + s) * nn, n);
        }
    c->n_seq++;
    c->fitted = 0;
    return MF_OK;
}

/* The output statistics for (kv_heads, head_dim), created on the first feed. */
static mf_status_t out_stats(mf_calib_t *c, uint32_t hkv, uint32_t d)
{
    if (c->out)
        return c->out->hkv == hkv && c->out->d == d ? MF_OK : MF_INVALID_ARGUMENT;
    return mf_calib_out_create(c->ls, c->hs, c->lt, c->ht, hkv, d, &c->out);
}

mf_status_t mf_calib_add_v(mf_calib_t *c, const float *src, const float *tgt, const float *v,
                           uint32_t n, uint32_t kv_heads, uint32_t head_dim)
{
    if (!c || !src || !tgt || !v || n < 1)
        return MF_INVALID_ARGUMENT;
    mf_status_t st = out_stats(c, kv_heads, head_dim);
    if (st == MF_OK)
        st = mf_calib_add(c, src, tgt, n);
    return st == MF_OK ? mf_calib_out_add_v(c->out, src, tgt, v, n) : st;
}

mf_status_t mf_calib_add_outputs(mf_calib_t *c, uint32_t t, uint32_t l, const float *o_src,
                                 const float *o_tgt, uint32_t n, uint32_t kv_heads,
                                 uint32_t head_dim)
{
    if (!c || !o_src || !o_tgt || n < 1 || t >= c->lt || l >= c->ls)
        return MF_INVALID_ARGUMENT;
    mf_status_t st = out_stats(c, kv_heads, head_dim);
    if (st == MF_OK)
        c->fitted = 0;
    return st == MF_OK ? mf_calib_out_add(c->out, t, l, o_src, o_tgt, n) : st;
}

void mf_simplex_project(double *v, uint32_t n)
{
    double u[MF_ROW_MAX_HEADS];
    if (n < 1 || n > MF_ROW_MAX_HEADS)
        return;
    memcpy(u, v, n * sizeof(double));
    for (uint32_t i = 1; i < n; i++) { /* insertion sort, descending; n ≤ 64 */
        double x = u[i];
        uint32_t j = i;
        for (; j > 0 && u[j - 1] < x; j--)
            u[j] = u[j - 1];
        u[j] = x;
    }
    double cum = 0, theta = 0;
    for (uint32_t j = 0; j < n; j++) {
        cum += u[j];
        double t = (cum - 1.0) / (j + 1);
        if (u[j] - t > 0)
            theta = t;
    }
    for (uint32_t j = 0; j < n; j++)
        v[j] = v[j] > theta ? v[j] - theta : 0.0;
}

/* f(w) = wᵀGw − 2bᵀw (the residual without the constant Σ T²). */
static double quad(const double *g, const double *b, const double *w, uint32_t n)
{
    double f = 0;
    for (uint32_t i = 0; i < n; i++) {
        double gw = 0;
        for (uint32_t j = 0; j < n; j++)
            gw += g[(size_t)i * n + j] * w[j];
        f += w[i] * gw - 2.0 * b[i] * w[i];
    }
    return f;
}

static double lambda_max(const double *g, uint32_t n)
{
    double x[MF_ROW_MAX_HEADS], y[MF_ROW_MAX_HEADS], lam = 0;
    for (uint32_t i = 0; i < n; i++)
        x[i] = 1.0 + 0.01 * i; /* not orthogonal to the top eigenvector of a PSD G */
    for (int it = 0; it < 200; it++) {
        double norm = 0;
        for (uint32_t i = 0; i < n; i++) {
            y[i] = 0;
            for (uint32_t j = 0; j < n; j++)
                y[i] += g[(size_t)i * n + j] * x[j];
            norm += y[i] * y[i];
        }
        norm = sqrt(norm);
        if (norm == 0)
            return 0;
        double xn = 0;
        for (uint32_t i = 0; i < n; i++)
            xn += x[i] * x[i];
        lam = norm / sqrt(xn);
        for (uint32_t i = 0; i < n; i++)
            x[i] = y[i] / norm;
    }
    return lam;
}

/* FISTA with adaptive restart on the simplex; returns f(w). */
static double fit_head(const double *g, const double *b, uint32_t n, uint32_t iters,
                       double lip, double *w)
{
    double y[MF_ROW_MAX_HEADS], xn[MF_ROW_MAX_HEADS];
    for (uint32_t i = 0; i < n; i++)
        w[i] = y[i] = 1.0 / n;
    double f = quad(g, b, w, n), t = 1.0;
    if (!(lip > 0))
        return f;
    for (uint32_t it = 0; it < iters; it++) {
        for (uint32_t i = 0; i < n; i++) {
            double gy = 0;
            for (uint32_t j = 0; j < n; j++)
                gy += g[(size_t)i * n + j] * y[j];
            xn[i] = y[i] - 2.0 * (gy - b[i]) / lip;
        }
        mf_simplex_project(xn, n);
        double fn = quad(g, b, xn, n), step = 0;
        if (fn > f) { /* restart: momentum overshot */
            t = 1.0;
            memcpy(y, w, n * sizeof(double));
            continue;
        }
        double tn = 0.5 * (1.0 + sqrt(1.0 + 4.0 * t * t));
        for (uint32_t i = 0; i < n; i++) {
            double dx = xn[i] - w[i];
            step = fabs(dx) > step ? fabs(dx) : step;
            y[i] = xn[i] + (t - 1.0) / tn * dx;
            w[i] = xn[i];
        }
        f = fn;
        t = tn;
        if (step < 1e-13)
            break;
    }
    return f;
}

static double rel_error(double resid, double norm)
{
    return norm > 0 ? sqrt(resid > 0 ? resid / norm : 0.0) : 0.0;
}

/* Head x's block masses of sequence q at `block` into out [nb, nb] (0 above the
 * diagonal); returns nb (full blocks only). */
static uint32_t coarse_masses(const mf_calib_t *c, uint64_t q, uint32_t x, uint32_t block,
                              double *out)
{
    uint32_t k = block / BASE_BLOCK, nb8 = c->bm_nb[q], nb = nb8 / k;
    const float *m = c->bm[q] + (size_t)x * ((size_t)nb8 * (nb8 + 1) / 2);
    memset(out, 0, (size_t)nb * nb * sizeof(double));
    for (uint32_t a = 0; a < nb * k; a++)
        for (uint32_t b = 0; b <= a; b++)
            out[(size_t)(a / k) * nb + b / k] += m[(size_t)a * (a + 1) / 2 + b];
    return nb;
}

/*
 * Mask-mode recall of every head of target layer t from source layer l with weights
 * w [ht][hs]: rec[h·np + g] = the share of the target head's own attention mass inside
 * the blocks that mask mode attends at target Top-P ps[g], over the full query blocks
 * i ≥ 1 of every sequence (block 0 and i are always attended, so i = 0 says nothing).
 * As in the apply kernel, the candidates are the blocks that some source head with
 * w > 0 keeps at its own Top-P src_p (the row's columns), and the selection is
 * mf_topp_select over the mixed source masses Σ_s w_s·mass_s.
 */
static mf_status_t mask_recall(const mf_calib_t *c, uint32_t t, uint32_t l, const double *w,
                               uint32_t block, double src_p, const double *ps, uint32_t np,
                               double *rec)
{
    uint32_t nbmax = 0, hs = c->hs, ht = c->ht;
    for (uint64_t q = 0; q < c->n_seq; q++)
        nbmax = c->bm_nb[q] / (block / BASE_BLOCK) > nbmax ? c->bm_nb[q] / (block / BASE_BLOCK)
                                                           : nbmax;
    size_t nn = (size_t)(nbmax ? nbmax : 1) * (nbmax ? nbmax : 1);
    double *sm = malloc(hs * nn * sizeof(double)), *tm = malloc(nn * sizeof(double));
    double *mix = malloc((nbmax + 1) * sizeof(double));
    double *num = calloc((size_t)ht * np, sizeof(double)), *den = calloc(ht, sizeof(double));
    uint8_t *ssel = malloc(hs * nn), *cand = malloc(nbmax + 1), *keep = malloc(nbmax + 1);
    mf_status_t st = MF_RESOURCE_EXHAUSTED;
    if (!sm || !tm || !mix || !num || !den || !ssel || !cand || !keep)
        goto out_free;
    st = MF_OK;
    for (uint64_t q = 0; q < c->n_seq && st == MF_OK; q++) {
        uint32_t nb = 0, kept;
        for (uint32_t s = 0; s < hs; s++) {
            nb = coarse_masses(c, q, l * hs + s, block, sm + s * nn);
            for (uint32_t i = 0; i < nb && st == MF_OK; i++)
                st = mf_topp_select(sm + s * nn + (size_t)i * nb, NULL, i + 1, src_p,
                                    ssel + s * nn + (size_t)i * nb, &kept);
        }
        for (uint32_t h = 0; h < ht && st == MF_OK; h++) {
            const double *wh = w + (size_t)h * hs;
            coarse_masses(c, q, c->ls * hs + t * ht + h, block, tm);
            for (uint32_t i = 1; i < nb && st == MF_OK; i++) {
                const double *trow = tm + (size_t)i * nb;
                for (uint32_t j = 0; j <= i; j++) {
                    mix[j] = 0;
                    cand[j] = 0;
                    for (uint32_t s = 0; s < hs; s++)
                        if (wh[s] > 0) {
                            mix[j] += wh[s] * sm[s * nn + (size_t)i * nb + j];
                            cand[j] |= ssel[s * nn + (size_t)i * nb + j];
                        }
                    den[h] += trow[j];
                }
                for (uint32_t g = 0; g < np && st == MF_OK; g++) {
                    st = mf_topp_select(mix, cand, i + 1, ps[g], keep, &kept);
                    for (uint32_t j = 0; j <= i; j++)
                        num[(size_t)h * np + g] += keep[j] ? trow[j] : 0.0;
                }
            }
        }
    }
    for (size_t x = 0; x < (size_t)ht * np; x++)
        rec[x] = den[x / np] > 0 ? num[x] / den[x / np] : 0.0;
out_free:
    free(sm);
    free(tm);
    free(mix);
    free(num);
    free(den);
    free(ssel);
    free(cand);
    free(keep);
    return st;
}

/*
 * Modes of target layer t's heads for weights w from source layer l: prob if the layer
 * error ≤ max_error and the head error < prob_max_error; else mask if its mask recall
 * reaches mask_min_recall (at mask_top_p, or at the smallest grid Top-P with
 * per_head_top_p) and its error < mask_max_error; else compute.
 */
static mf_status_t assign_modes(const mf_calib_t *c, const mf_calib_opts_t *o, uint32_t t,
                                uint32_t l, const double *w, const double *herr,
                                double layer_err, uint8_t *mode, double *recall,
                                double *top_p)
{
    const double *ps = o->per_head_top_p ? topp_grid : &o->mask_top_p;
    uint32_t np = o->per_head_top_p ? (uint32_t)N_GRID : 1;
    double *rec = malloc((size_t)c->ht * np * sizeof(double));
    if (!rec)
        return MF_RESOURCE_EXHAUSTED;
    mf_status_t st = mask_recall(c, t, l, w, o->block_size, o->mask_top_p, ps, np, rec);
    for (uint32_t h = 0; h < c->ht && st == MF_OK; h++) {
        const double *r = rec + (size_t)h * np;
        uint32_t g = 0;
        while (g < np && r[g] < o->mask_min_recall)
            g++;
        mode[h] = MF_HEAD_COMPUTE;
        /* not a mask head: report what mask mode could reach at the largest Top-P */
        top_p[h] = ps[np - 1];
        recall[h] = r[np - 1];
        if (layer_err <= o->max_error && herr[h] < o->prob_max_error) {
            mode[h] = MF_HEAD_PROB;
        } else if (g < np && herr[h] < o->mask_max_error) {
            mode[h] = MF_HEAD_MASK;
            top_p[h] = ps[g];
            recall[h] = r[g];
        }
    }
    free(rec);
    return st;
}

static void fill_defaults(const mf_calib_opts_t *in, mf_calib_opts_t *o)
{
    *o = *in;
    if (!(o->max_error > 0))
        o->max_error = 0.9;
    if (!(o->prob_max_error > 0))
        o->prob_max_error = 0.2;
    if (!(o->mask_max_error > 0))
        o->mask_max_error = INFINITY;
    if (!(o->mask_min_recall > 0) || o->mask_min_recall > 1)
        o->mask_min_recall = 0.9;
    if (!(o->mask_top_p > 0) || o->mask_top_p > 1)
        o->mask_top_p = 0.95;
    if (!o->block_size)
        o->block_size = 64;
    if (!o->max_iters)
        o->max_iters = 5000;
}

/* One target head's least-squares problem against one source layer: residual(w) =
 * wᵀ·g·w − 2·bᵀw + norm, and the error's scale (maps: norm; outputs: the centred norm). */
typedef struct head_stats {
    const double *g, *b;
    double norm, scale;
} head_stats_t;

static head_stats_t head_stats(const mf_calib_t *c, int objective, uint32_t t, uint32_t l,
                               uint32_t h)
{
    head_stats_t s;
    if (objective == MF_CALIB_OUTPUTS) {
        const mf_calib_out_t *o = c->out;
        size_t pair = (size_t)t * c->ls + l;
        s.g = o->gram + (pair * o->hkv + h / (c->ht / o->hkv)) * c->hs * c->hs;
        s.b = o->cross + (pair * c->ht + h) * c->hs;
        s.norm = o->norm[pair * c->ht + h];
        s.scale = o->cnorm[pair * c->ht + h];
    } else {
        s.g = c->gram + (size_t)l * c->hs * c->hs;
        s.b = c->cross + (((size_t)t * c->ls + l) * c->ht + h) * c->hs;
        s.norm = s.scale = c->tnorm[(size_t)t * c->ht + h];
    }
    return s;
}

/* Fits target layer t against source layer l into w/herr; returns the layer error. */
static double fit_pair(const mf_calib_t *c, int objective, uint32_t t, uint32_t l,
                       uint32_t iters, double *w, double *herr)
{
    const double *g_lip = NULL; /* heads sharing a Gram matrix share its Lipschitz bound */
    double lip = 0, rsum = 0, nsum = 0;
    for (uint32_t h = 0; h < c->ht; h++) {
        head_stats_t s = head_stats(c, objective, t, l, h);
        if (s.g != g_lip) {
            lip = 2.0 * lambda_max(s.g, c->hs) * 1.01;
            g_lip = s.g;
        }
        double f = fit_head(s.g, s.b, c->hs, iters, lip, w + (size_t)h * c->hs);
        herr[h] = rel_error(f + s.norm, s.scale);
        rsum += f + s.norm;
        nsum += s.scale;
    }
    return rel_error(rsum, nsum);
}

/* IAM-style: each head takes its most cosine-similar source head of layer l. */
static double fit_baseline(const mf_calib_t *c, int objective, uint32_t t, uint32_t l,
                           double *w, double *herr)
{
    double rsum = 0, nsum = 0;
    for (uint32_t h = 0; h < c->ht; h++) {
        head_stats_t stats = head_stats(c, objective, t, l, h);
        const double *g = stats.g, *b = stats.b;
        double norm = stats.norm, best = -INFINITY;
        uint32_t arg = 0;
        for (uint32_t s = 0; s < c->hs; s++) {
            double gs = g[(size_t)s * c->hs + s];
            double cosv = gs > 0 && norm > 0 ? b[s] / sqrt(gs * norm) : 0.0;
            if (cosv > best) {
                best = cosv;
                arg = s;
            }
        }
        memset(w + (size_t)h * c->hs, 0, c->hs * sizeof(double));
        w[(size_t)h * c->hs + arg] = 1.0;
        double resid = g[(size_t)arg * c->hs + arg] - 2.0 * b[arg] + norm;
        herr[h] = rel_error(resid, stats.scale);
        rsum += resid;
        nsum += stats.scale;
    }
    return rel_error(rsum, nsum);
}

mf_status_t mf_calib_fit(mf_calib_t *c, const mf_calib_opts_t *opts)
{
    mf_calib_opts_t o;
    if (!c || !opts)
        return MF_INVALID_ARGUMENT;
    if (!c->n_seq)
        return MF_FAILED_PRECONDITION;
    fill_defaults(opts, &o);
    if (o.block_size < BASE_BLOCK || (o.block_size & (o.block_size - 1)) ||
        (o.objective != MF_CALIB_MAPS && o.objective != MF_CALIB_OUTPUTS))
        return MF_INVALID_ARGUMENT;
    if (o.objective == MF_CALIB_OUTPUTS) { /* every pair saw every sequence of the maps */
        if (!c->out)
            return MF_FAILED_PRECONDITION;
        for (size_t x = 0; x < (size_t)c->lt * c->ls; x++)
            if (c->out->count[x] != c->n_seq)
                return MF_FAILED_PRECONDITION;
    }
    size_t hw = (size_t)c->ht * c->hs;
    double *w = malloc(hw * sizeof(double)), *herr = malloc(c->ht * sizeof(double));
    mf_status_t st = MF_RESOURCE_EXHAUSTED;
    if (!w || !herr)
        goto out_free;
    st = MF_OK;
    c->l0 = c->lt;
    for (uint32_t t = 0; t < c->lt; t++) {
        double best = INFINITY;
        for (uint32_t l = 0; l < c->ls; l++) {
            double e = fit_pair(c, o.objective, t, l, o.max_iters, w, herr);
            c->src_err[(size_t)t * c->ls + l] = e;
            if (e < best) { /* ties keep the lower source layer */
                best = e;
                c->src_layer[t] = l;
                c->err[t] = e;
                memcpy(c->w + (size_t)t * hw, w, hw * sizeof(double));
                memcpy(c->herr + (size_t)t * c->ht, herr, c->ht * sizeof(double));
            }
        }
        c->berr[t] = fit_baseline(c, o.objective, t, c->src_layer[t], c->bw + (size_t)t * hw,
                                  c->bherr + (size_t)t * c->ht);
        size_t k = (size_t)t * c->ht;
        st = assign_modes(c, &o, t, c->src_layer[t], c->w + t * hw, c->herr + k, c->err[t],
                          c->mode + k, c->recall + k, c->top_p + k);
        if (st == MF_OK)
            st = assign_modes(c, &o, t, c->src_layer[t], c->bw + t * hw, c->bherr + k,
                              c->berr[t], c->bmode + k, c->brecall + k, c->btop_p + k);
        if (st != MF_OK)
            goto out_free;
        int mapped = 0;
        for (uint32_t h = 0; h < c->ht; h++)
            mapped |= c->mode[k + h] != MF_HEAD_COMPUTE;
        if (mapped && t >= o.min_l0 && c->l0 == c->lt)
            c->l0 = t;
    }
    c->fitted = 1;
    c->objective = o.objective;
out_free:
    free(w);
    free(herr);
    return st;
}

uint32_t mf_calib_l0(const mf_calib_t *c)
{
    return c ? c->l0 : 0;
}

mf_status_t mf_calib_layer(const mf_calib_t *c, uint32_t t, mf_calib_layer_t *out)
{
    if (!c || !out || t >= c->lt)
        return MF_INVALID_ARGUMENT;
    if (!c->fitted)
        return MF_FAILED_PRECONDITION;
    size_t hw = (size_t)c->ht * c->hs;
    out->target_layer = t;
    out->source_layer = c->src_layer[t];
    out->error = c->err[t];
    out->w = c->w + t * hw;
    out->head_error = c->herr + (size_t)t * c->ht;
    out->mode = c->mode + (size_t)t * c->ht;
    out->recall = c->recall + (size_t)t * c->ht;
    out->top_p = c->top_p + (size_t)t * c->ht;
    out->source_errors = c->src_err + (size_t)t * c->ls;
    out->base_error = c->berr[t];
    out->base_w = c->bw + t * hw;
    out->base_head_error = c->bherr + (size_t)t * c->ht;
    out->base_mode = c->bmode + (size_t)t * c->ht;
    out->base_recall = c->brecall + (size_t)t * c->ht;
    out->base_top_p = c->btop_p + (size_t)t * c->ht;
    return MF_OK;
}

mf_status_t mf_calib_profile(const mf_calib_t *c, const mf_calib_opts_t *opts, int baseline,
                             Mapflow__V1__MappingProfile **out)
{
    mf_calib_opts_t o;
    const char *why;
    if (!c || !opts || !out)
        return MF_INVALID_ARGUMENT;
    if (!c->fitted)
        return MF_FAILED_PRECONDITION;
    fill_defaults(opts, &o);
    uint32_t n_layers = c->lt - c->l0;
    size_t hw = (size_t)c->ht * c->hs;
    Mapflow__V1__MappingProfile p = MAPFLOW__V1__MAPPING_PROFILE__INIT;
    Mapflow__V1__RecomputePolicy rp = MAPFLOW__V1__RECOMPUTE_POLICY__INIT;
    Mapflow__V1__LayerMap *lms = calloc(n_layers ? n_layers : 1, sizeof(*lms));
    Mapflow__V1__LayerMap **lmp = calloc(n_layers ? n_layers : 1, sizeof(*lmp));
    Mapflow__V1__HeadProfile *hps = calloc((size_t)(n_layers ? n_layers : 1) * c->ht,
                                           sizeof(*hps));
    Mapflow__V1__HeadProfile **hpp = calloc((size_t)(n_layers ? n_layers : 1) * c->ht,
                                            sizeof(*hpp));
    float *wf = calloc((n_layers ? n_layers : 1) * hw, sizeof(float));
    uint8_t *buf = NULL;
    mf_status_t st = MF_RESOURCE_EXHAUSTED;
    if (!lms || !lmp || !hps || !hpp || !wf)
        goto out_arrays;
    p.source_model = (char *)(o.source_model ? o.source_model : "source");
    p.target_model = (char *)(o.target_model ? o.target_model : "target");
    p.block_size = o.block_size;
    p.l0 = c->l0;
    p.target_layers = c->lt;
    p.n_layers = n_layers;
    p.layers = lmp;
    rp.last_blocks = o.recompute_last;
    rp.first_blocks = o.recompute_first;
    p.recompute = &rp;
    static const char *const by[2][2] = {
        { "mapflow-calibrate", "mapflow-calibrate (IAM-style argmax baseline)" },
        { "mapflow-calibrate (output objective)",
          "mapflow-calibrate (output objective, IAM-style argmax baseline)" } };
    p.created_by = (char *)by[c->objective == MF_CALIB_OUTPUTS][baseline != 0];
    for (uint32_t k = 0; k < n_layers; k++) {
        uint32_t t = c->l0 + k;
        const double *w = (baseline ? c->bw : c->w) + t * hw;
        const double *he = (baseline ? c->bherr : c->herr) + (size_t)t * c->ht;
        const uint8_t *md = (baseline ? c->bmode : c->mode) + (size_t)t * c->ht;
        const double *tp = (baseline ? c->btop_p : c->top_p) + (size_t)t * c->ht;
        Mapflow__V1__LayerMap *lm = &lms[k];
        mapflow__v1__layer_map__init(lm);
        lm->target_layer = t;
        lm->source_layer = c->src_layer[t];
        lm->target_heads = c->ht;
        lm->source_heads = c->hs;
        lm->n_w = hw;
        lm->w = wf + k * hw;
        for (size_t x = 0; x < hw; x++)
            lm->w[x] = (float)w[x];
        lm->error = (float)(baseline ? c->berr[t] : c->err[t]);
        lm->n_heads = c->ht;
        lm->heads = hpp + (size_t)k * c->ht;
        for (uint32_t h = 0; h < c->ht; h++) {
            Mapflow__V1__HeadProfile *hp = &hps[(size_t)k * c->ht + h];
            mapflow__v1__head_profile__init(hp);
            hp->mode = (Mapflow__V1__HeadMode)md[h];
            hp->error = (float)he[h];
            hp->top_p = (float)tp[h];
            lm->heads[h] = hp;
        }
        lmp[k] = lm;
    }
    /* Pack and unpack: the result is an ordinary unpacked message (mf_profile_free). */
    size_t len = mapflow__v1__mapping_profile__get_packed_size(&p);
    buf = malloc(len ? len : 1);
    if (!buf)
        goto out_arrays;
    mapflow__v1__mapping_profile__pack(&p, buf);
    st = mf_profile_decode(buf, len, out, &why);
    free(buf);
out_arrays:
    free(lms);
    free(lmp);
    free(hps);
    free(hpp);
    free(wf);
    return st;
}
