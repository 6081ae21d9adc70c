/* calibrate — simplex-constrained least-squares head mixing (see calibrate.h). */
#include "calibrate.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "mf_profile.h"
#include "ref_util.h"

struct mf_calib {
    uint32_t ls, hs, lt, ht;
    uint64_t n_seq;
    double *gram;      /* [ls][hs][hs]  Σ S_a·S_b */
    double *cross;     /* [lt][ls][ht][hs]  Σ T_h·S_s */
    double *tnorm;     /* [lt][ht]  Σ T_h² */
    /* results */
    int fitted;
    uint32_t l0;
    uint32_t *src_layer;   /* [lt] */
    double *err;           /* [lt] */
    double *w;             /* [lt][ht][hs] */
    double *herr;          /* [lt][ht] */
    uint8_t *mode;         /* [lt][ht] */
    double *src_err;       /* [lt][ls] */
    double *berr;          /* [lt] */
    double *bw;            /* [lt][ht][hs] */
    double *bherr;         /* [lt][ht] */
    uint8_t *bmode;        /* [lt][ht] */
};

void mf_calib_destroy(mf_calib_t *c)
{
    if (!c)
        return;
    free(c->gram);
    free(c->cross);
    free(c->tnorm);
    free(c->src_layer);
    free(c->err);
    free(c->w);
    free(c->herr);
    free(c->mode);
    free(c->src_err);
    free(c->berr);
    free(c->bw);
    free(c->bherr);
    free(c->bmode);
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
    c->src_err = calloc((size_t)lt * ls, sizeof(double));
    c->berr = calloc(lt, sizeof(double));
    c->bw = calloc(whs, sizeof(double));
    c->bherr = calloc((size_t)lt * ht, sizeof(double));
    c->bmode = calloc((size_t)lt * ht, 1);
    if (!c->gram || !c->cross || !c->tnorm || !c->src_layer || !c->err || !c->w || !c->herr ||
        !c->mode || !c->src_err || !c->berr || !c->bw || !c->bherr || !c->bmode) {
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

mf_status_t mf_calib_add(mf_calib_t *c, const float *src, const float *tgt, uint32_t n)
{
    if (!c || !src || !tgt || n < 1)
        return MF_INVALID_ARGUMENT;
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

static uint8_t head_mode(double err, const mf_calib_opts_t *o)
{
    if (err < o->prob_max_error)
        return MF_HEAD_PROB;
    if (err < o->mask_max_error)
        return MF_HEAD_MASK;
    return MF_HEAD_COMPUTE;
}

static void fill_defaults(const mf_calib_opts_t *in, mf_calib_opts_t *o)
{
    *o = *in;
    if (!(o->max_error > 0))
        o->max_error = 0.9;
    if (!(o->prob_max_error > 0))
        o->prob_max_error = 0.2;
    if (!(o->mask_max_error > 0))
        o->mask_max_error = 0.9;
    if (!(o->mask_top_p > 0) || o->mask_top_p > 1)
        o->mask_top_p = 0.95;
    if (!o->block_size)
        o->block_size = 64;
    if (!o->max_iters)
        o->max_iters = 5000;
}

/* Fits target layer t against source layer l into w/herr; returns the layer error. */
static double fit_pair(const mf_calib_t *c, uint32_t t, uint32_t l, uint32_t iters,
                       double *w, double *herr)
{
    const double *g = c->gram + (size_t)l * c->hs * c->hs;
    double lip = 2.0 * lambda_max(g, c->hs) * 1.01, rsum = 0, nsum = 0;
    for (uint32_t h = 0; h < c->ht; h++) {
        const double *b = c->cross + (((size_t)t * c->ls + l) * c->ht + h) * c->hs;
        double norm = c->tnorm[(size_t)t * c->ht + h];
        double f = fit_head(g, b, c->hs, iters, lip, w + (size_t)h * c->hs);
        herr[h] = rel_error(f + norm, norm);
        rsum += f + norm;
        nsum += norm;
    }
    return rel_error(rsum, nsum);
}

/* IAM-style: each head takes its most cosine-similar source head of layer l. */
static double fit_baseline(const mf_calib_t *c, uint32_t t, uint32_t l, double *w,
                           double *herr)
{
    const double *g = c->gram + (size_t)l * c->hs * c->hs;
    double rsum = 0, nsum = 0;
    for (uint32_t h = 0; h < c->ht; h++) {
        const double *b = c->cross + (((size_t)t * c->ls + l) * c->ht + h) * c->hs;
        double norm = c->tnorm[(size_t)t * c->ht + h], best = -INFINITY;
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
        herr[h] = rel_error(resid, norm);
        rsum += resid;
        nsum += norm;
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
    size_t hw = (size_t)c->ht * c->hs;
    double *w = malloc(hw * sizeof(double)), *herr = malloc(c->ht * sizeof(double));
    if (!w || !herr) {
        free(w);
        free(herr);
        return MF_RESOURCE_EXHAUSTED;
    }
    c->l0 = c->lt;
    for (uint32_t t = 0; t < c->lt; t++) {
        double best = INFINITY;
        for (uint32_t l = 0; l < c->ls; l++) {
            double e = fit_pair(c, t, l, o.max_iters, w, herr);
            c->src_err[(size_t)t * c->ls + l] = e;
            if (e < best) { /* ties keep the lower source layer */
                best = e;
                c->src_layer[t] = l;
                c->err[t] = e;
                memcpy(c->w + (size_t)t * hw, w, hw * sizeof(double));
                memcpy(c->herr + (size_t)t * c->ht, herr, c->ht * sizeof(double));
            }
        }
        c->berr[t] = fit_baseline(c, t, c->src_layer[t], c->bw + (size_t)t * hw,
                                  c->bherr + (size_t)t * c->ht);
        int layer_ok = c->err[t] <= o.max_error;
        for (uint32_t h = 0; h < c->ht; h++) {
            size_t k = (size_t)t * c->ht + h;
            c->mode[k] = layer_ok ? head_mode(c->herr[k], &o) : MF_HEAD_COMPUTE;
            c->bmode[k] = c->berr[t] <= o.max_error ? head_mode(c->bherr[k], &o)
                                                    : MF_HEAD_COMPUTE;
        }
        if (layer_ok && t >= o.min_l0 && c->l0 == c->lt)
            c->l0 = t;
    }
    free(w);
    free(herr);
    c->fitted = 1;
    return MF_OK;
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
    out->source_errors = c->src_err + (size_t)t * c->ls;
    out->base_error = c->berr[t];
    out->base_w = c->bw + t * hw;
    out->base_head_error = c->bherr + (size_t)t * c->ht;
    out->base_mode = c->bmode + (size_t)t * c->ht;
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
    p.created_by = (char *)(baseline ? "mapflow-calibrate (IAM-style argmax baseline)"
                                     : "mapflow-calibrate");
    for (uint32_t k = 0; k < n_layers; k++) {
        uint32_t t = c->l0 + k;
        const double *w = (baseline ? c->bw : c->w) + t * hw;
        const double *he = (baseline ? c->bherr : c->herr) + (size_t)t * c->ht;
        const uint8_t *md = (baseline ? c->bmode : c->mode) + (size_t)t * c->ht;
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
            hp->top_p = (float)o.mask_top_p;
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
