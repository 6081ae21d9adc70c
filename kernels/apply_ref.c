/* apply_ref — target side: rows + layer map + target Q, K, V → O, one head mode per target
 * head (mapflow_kernels.h). Loop order is query block → head → row columns, the order the
 * fused GPU kernel uses: each row is walked once per block, only present heads are read. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "mapflow_kernels.h"
#include "ref_util.h"

typedef struct apply_work {
    double *scores;    /* [N] */
    double *out;       /* [d] */
    double *acc;       /* [B][d] prob-mode numerators */
    double *kmass;     /* [B] prob-mode kept mass per query row */
    double *mixed;     /* [B×B] mixed tile */
    float *tile;       /* [B×B] one decoded tile */
    double *mass;      /* [nb] mixed block masses (mask mode) */
    uint8_t *cand;     /* [nb] */
    uint8_t *keep;     /* [nb] */
} apply_work_t;

static void work_free(apply_work_t *w)
{
    free(w->scores);
    free(w->out);
    free(w->acc);
    free(w->kmass);
    free(w->mixed);
    free(w->tile);
    free(w->mass);
    free(w->cand);
    free(w->keep);
}

static mf_status_t work_alloc(apply_work_t *w, uint32_t n, uint32_t d, uint32_t b,
                              uint32_t nb)
{
    memset(w, 0, sizeof(*w));
    w->scores = malloc((size_t)n * sizeof(double));
    w->out = malloc((size_t)d * sizeof(double));
    w->acc = malloc((size_t)b * d * sizeof(double));
    w->kmass = malloc((size_t)b * sizeof(double));
    w->mixed = malloc((size_t)b * b * sizeof(double));
    w->tile = malloc((size_t)b * b * sizeof(float));
    w->mass = malloc((size_t)nb * sizeof(double));
    w->cand = malloc(nb);
    w->keep = malloc(nb);
    if (!w->scores || !w->out || !w->acc || !w->kmass || !w->mixed || !w->tile || !w->mass ||
        !w->cand || !w->keep) {
        work_free(w);
        return MF_RESOURCE_EXHAUSTED;
    }
    return MF_OK;
}

#define FAIL(st_, msg)  \
    do {                \
        *why = (msg);   \
        return (st_);   \
    } while (0)

static mf_status_t check_map(const mf_layer_map_t *m, uint32_t ht, const char **why)
{
    if (!m || !m->w || !m->mode)
        FAIL(MF_INVALID_ARGUMENT, "layer map with W and modes is required");
    if (m->n_target_heads != ht)
        FAIL(MF_INVALID_ARGUMENT, "layer map target heads differ from the target's Hq");
    if (m->n_source_heads < 1 || m->n_source_heads > MF_ROW_MAX_HEADS)
        FAIL(MF_INVALID_ARGUMENT, "layer map source heads out of range (1..64)");
    for (uint32_t t = 0; t < ht; t++) {
        if (m->mode[t] > MF_HEAD_MASK)
            FAIL(MF_INVALID_ARGUMENT, "unknown head mode");
        if (m->top_p && !(m->top_p[t] > 0.0f && m->top_p[t] <= 1.0f))
            FAIL(MF_INVALID_ARGUMENT, "target top_p outside (0, 1]");
        for (uint32_t s = 0; s < m->n_source_heads; s++) {
            float x = m->w[(size_t)t * m->n_source_heads + s];
            if (!(x >= 0.0f && isfinite(x)))
                FAIL(MF_INVALID_ARGUMENT, "W has a negative or non-finite weight");
        }
    }
    return MF_OK;
}

static mf_status_t check_rows(const mf_apply_args_t *a, int any_prob, uint32_t full_blocks,
                              const char **why)
{
    if (a->n_rows && !a->rows)
        FAIL(MF_INVALID_ARGUMENT, "n_rows > 0 but no row array");
    if (a->n_rows > full_blocks)
        FAIL(MF_INVALID_ARGUMENT, "more rows than full query blocks");
    for (uint32_t i = 0; i < a->n_rows; i++) {
        const mf_row_view_t *r = a->rows[i];
        if (!r)
            continue;
        if (r->block_index != i)
            FAIL(MF_INVALID_ARGUMENT, "rows[i] is not query block i");
        if (r->block_size != a->block_size)
            FAIL(MF_INVALID_ARGUMENT, "row block size differs from the layer's");
        if (r->n_heads != a->map->n_source_heads)
            FAIL(MF_INVALID_ARGUMENT, "row head count differs from the map's source heads");
        if (any_prob && r->codec == MF_CODEC_MASK)
            FAIL(MF_FAILED_PRECONDITION, "a prob-mode head needs tiles; this row is MASK");
    }
    return MF_OK;
}

static void store_row(float *o, const double *v, uint32_t d)
{
    for (uint32_t x = 0; x < d; x++)
        o[x] = (float)v[x];
}

static float *out_at(const mf_apply_args_t *a, const mf__staged_t *s, uint32_t r, uint32_t t)
{
    return a->o + ((size_t)r * s->hq + t) * s->d;
}

static void head_exact(const mf_apply_args_t *a, const mf__staged_t *s, apply_work_t *w,
                       uint32_t t, uint32_t r0, uint32_t r1, const uint8_t *keep)
{
    for (uint32_t r = r0; r < r1; r++) {
        mf__attend_row(s, t, r, keep, a->block_size, w->scores, w->out);
        store_row(out_at(a, s, r, t), w->out, s->d);
    }
}

static void head_mask(const mf_apply_args_t *a, const mf__staged_t *s, apply_work_t *w,
                      const mf_row_view_t *row, uint32_t t, mf_apply_stats_t *st)
{
    const mf_layer_map_t *m = a->map;
    const float *wt = m->w + (size_t)t * m->n_source_heads;
    uint32_t i = row->block_index, b = a->block_size, kept;
    memset(w->mass, 0, (i + 1) * sizeof(double));
    memset(w->cand, 0, i + 1);
    for (uint32_t c = 0; c < row->n_cols; c++) {
        uint32_t j = row->cols[c];
        for (uint32_t src = 0; src < row->n_heads; src++) {
            int64_t e = mf_row_entry(row, c, src);
            if (e < 0 || wt[src] <= 0.0f)
                continue;
            w->mass[j] += (double)wt[src] * mf_row_mass(row, (uint32_t)e);
            w->cand[j] = 1;
        }
    }
    double tp = m->top_p ? m->top_p[t] : 1.0;
    mf_topp_select(w->mass, w->cand, i + 1, tp, w->keep, &kept);
    st->mask_blocks += kept;
    st->mask_candidates += i + 1;
    head_exact(a, s, w, t, i * b, (i + 1) * b, w->keep);
}

static void head_prob(const mf_apply_args_t *a, const mf__staged_t *s, apply_work_t *w,
                      const mf_row_view_t *row, uint32_t t, mf_apply_stats_t *st)
{
    const mf_layer_map_t *m = a->map;
    const float *wt = m->w + (size_t)t * m->n_source_heads;
    uint32_t i = row->block_index, b = a->block_size, d = s->d, kv = t / s->group;
    memset(w->acc, 0, (size_t)b * d * sizeof(double));
    memset(w->kmass, 0, b * sizeof(double));
    for (uint32_t c = 0; c < row->n_cols; c++) {
        uint32_t j = row->cols[c];
        int any = 0;
        memset(w->mixed, 0, (size_t)b * b * sizeof(double));
        for (uint32_t src = 0; src < row->n_heads; src++) {
            int64_t e = mf_row_entry(row, c, src);
            if (e < 0 || wt[src] <= 0.0f)
                continue;
            const uint8_t *tile = (const uint8_t *)row->tiles + (size_t)e * row->tile_bytes;
            mf_tile_decode(row->codec, b, tile, row->scales ? row->scales[e] : 0.0f, w->tile);
            for (size_t x = 0; x < (size_t)b * b; x++)
                w->mixed[x] += (double)wt[src] * w->tile[x];
            any = 1;
        }
        if (!any)
            continue;
        st->prob_tiles++;
        for (uint32_t q = 0; q < b; q++) {
            /* Causality is enforced here too, whatever the tile holds above the diagonal. */
            uint32_t kmax = j == i ? q + 1 : b;
            for (uint32_t kk = 0; kk < kmax; kk++) {
                double p = w->mixed[(size_t)q * b + kk];
                if (p == 0.0)
                    continue;
                w->kmass[q] += p;
                ref_axpy(w->acc + (size_t)q * d, p,
                         s->v + ((size_t)(j * b + kk) * s->hkv + kv) * d, d);
            }
        }
    }
    for (uint32_t q = 0; q < b; q++) {
        uint32_t r = i * b + q;
        if (w->kmass[q] > 0.0) {
            for (uint32_t x = 0; x < d; x++)
                w->out[x] = w->acc[(size_t)q * d + x] / w->kmass[q];
            store_row(out_at(a, s, r, t), w->out, d);
        } else {
            head_exact(a, s, w, t, r, r + 1, NULL); /* everything quantised away */
        }
    }
}

static int block_is_exact(const mf_apply_args_t *a, uint32_t i, uint32_t full_blocks)
{
    if (i >= full_blocks || i >= a->n_rows || !a->rows[i])
        return 1;
    if (a->exact && a->exact[i])
        return 1;
    return i < a->exact_first || (uint64_t)i + a->exact_last >= full_blocks;
}

mf_status_t mf_apply_ref(const mf_apply_args_t *a, mf_apply_stats_t *stats, const char **why)
{
    const char *dummy;
    mf_apply_stats_t local = { 0 };
    mf__staged_t s;
    apply_work_t w;
    if (!why)
        why = &dummy;
    *why = "";
    if (!stats)
        stats = &local;
    memset(stats, 0, sizeof(*stats));
    if (!a || !a->o)
        FAIL(MF_INVALID_ARGUMENT, "arguments and output O are required");
    uint32_t b = a->block_size;
    if (b < MF_ROW_MIN_BLOCK || b > MF_ROW_MAX_BLOCK || (b & (b - 1)))
        FAIL(MF_INVALID_ARGUMENT, "block size must be a power of two in [8, 256]");
    mf_status_t st = mf_qkv_check(&a->tgt, 1, why);
    if (st != MF_OK)
        return st;
    st = check_map(a->map, a->tgt.n_q_heads, why);
    if (st != MF_OK)
        return st;
    int any_prob = 0;
    for (uint32_t t = 0; t < a->map->n_target_heads; t++)
        any_prob |= a->map->mode[t] == MF_HEAD_PROB;
    uint32_t n = a->tgt.n_tokens, full = n / b, all = (n + b - 1) / b;
    st = check_rows(a, any_prob, full, why);
    if (st != MF_OK)
        return st;
    st = mf__stage(&a->tgt, 1, &s, why);
    if (st != MF_OK)
        return st;
    st = work_alloc(&w, n, s.d, b, all);
    if (st != MF_OK) {
        *why = "out of memory for apply scratch";
        goto out_stage;
    }
    uint32_t q1 = a->q1 ? a->q1 : all;
    if (a->q0 >= q1 || q1 > all) {
        *why = "query block range must satisfy q0 < q1 <= ceil(N / B)";
        st = MF_INVALID_ARGUMENT;
        goto out_work;
    }
    for (uint32_t i = a->q0; i < q1; i++) {
        int exact = block_is_exact(a, i, full);
        uint32_t r0 = i * b, r1 = r0 + b < n ? r0 + b : n;
        for (uint32_t t = 0; t < s.hq; t++) {
            uint8_t mode = exact ? MF_HEAD_COMPUTE : a->map->mode[t];
            if (mode == MF_HEAD_MASK) {
                head_mask(a, &s, &w, a->rows[i], t, stats);
            } else if (mode == MF_HEAD_PROB) {
                head_prob(a, &s, &w, a->rows[i], t, stats);
            } else {
                head_exact(a, &s, &w, t, r0, r1, NULL);
                stats->exact_blocks++;
            }
        }
    }
    st = MF_OK;
out_work:
    work_free(&w);
out_stage:
    mf__unstage(&s);
    return st;
}
