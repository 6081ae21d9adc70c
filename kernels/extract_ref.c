/* extract_ref — source side: Q, K → block masses → Top-P → map rows (mapflow_kernels.h).
 *
 * Two passes per query block, as the GPU kernel does: the first computes every (head,
 * key block) mass from the scaled scores and the row LSE; the selection and the column
 * union follow; the second recomputes P = exp(s − LSE) only on the kept tiles and encodes
 * them straight into the row buffer (prob codecs only). With MF_EXTRACT_SAMPLE the first
 * pass reads only the sampled rows' scores; everything after the masses is unchanged. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "mapflow_kernels.h"
#include "mf_codec.h"
#include "ref_util.h"

size_t mf_extract_row_bound(mf_codec_t codec, uint32_t block_size, uint32_t n_heads,
                            uint32_t block_index, size_t model_len)
{
    mf_row_layout_t l;
    if (model_len < 1 || model_len > MF_ROW_MAX_MODEL || block_index >= UINT32_MAX ||
        (uint64_t)(block_index + 1) * n_heads > UINT32_MAX)
        return 0;
    uint32_t cols = block_index + 1;
    if (mf_row_layout(codec, block_size, n_heads, cols, cols * n_heads, (uint32_t)model_len,
                      &l) != MF_OK)
        return 0;
    return l.total;
}

/* Scratch of one call, sized for the last (largest) block. */
typedef struct extract_work {
    double *mass;      /* [Hq][i1] */
    double *lse;       /* [Hq][B]: LSE of each query row of the current block */
    double *scores;    /* [N] */
    uint8_t *keep;     /* [Hq][i1] */
    uint32_t *cols;    /* [i1] */
    uint64_t *mask;    /* [i1] */
    float *tile;       /* [B×B] */
    mf_hash128_t *hash; /* [i1 + 1]: hash[x + 1] = h(x), hash[0] = h(-1) */
} extract_work_t;

static void work_free(extract_work_t *w)
{
    free(w->mass);
    free(w->lse);
    free(w->scores);
    free(w->keep);
    free(w->cols);
    free(w->mask);
    free(w->tile);
    free(w->hash);
}

static mf_status_t work_alloc(extract_work_t *w, uint32_t hq, uint32_t nb, uint32_t b,
                              uint32_t n)
{
    memset(w, 0, sizeof(*w));
    w->mass = malloc((size_t)hq * nb * sizeof(double));
    w->lse = malloc((size_t)hq * b * sizeof(double));
    w->scores = malloc((size_t)n * sizeof(double));
    w->keep = malloc((size_t)hq * nb);
    w->cols = malloc((size_t)nb * sizeof(uint32_t));
    w->mask = malloc((size_t)nb * sizeof(uint64_t));
    w->tile = malloc((size_t)b * b * sizeof(float));
    w->hash = malloc(((size_t)nb + 1) * sizeof(mf_hash128_t));
    if (!w->mass || !w->lse || !w->scores || !w->keep || !w->cols || !w->mask || !w->tile ||
        !w->hash) {
        work_free(w);
        return MF_RESOURCE_EXHAUSTED;
    }
    return MF_OK;
}

mf_status_t mf_extract_options(uint32_t fields, uint32_t sample_stride, uint32_t sample_offset,
                               uint32_t block_size, uint32_t *stride, uint32_t *offset,
                               const char **why)
{
    const char *dummy;
    if (!why)
        why = &dummy;
    *stride = 1;
    *offset = 0;
    if (fields & ~MF_EXTRACT_FIELDS_ALL) {
        *why = "unknown extract option bits in fields";
        return MF_INVALID_ARGUMENT;
    }
    if (!(fields & MF_EXTRACT_SAMPLE))
        return MF_OK;
    /* B is a power of two, so "divides B" is "a power of two ≤ B" */
    if (sample_stride < 1 || sample_stride > block_size || (sample_stride & (sample_stride - 1))) {
        *why = "sample_stride must be a power of two in [1, B] (it must divide the block size)";
        return MF_INVALID_ARGUMENT;
    }
    if (sample_offset >= sample_stride) {
        *why = "sample_offset must be < sample_stride";
        return MF_INVALID_ARGUMENT;
    }
    *stride = sample_stride;
    *offset = sample_offset;
    return MF_OK;
}

static mf_status_t check_args(const mf_extract_args_t *a, void *const *rows,
                              const size_t *caps, size_t *sizes, uint32_t *stride,
                              uint32_t *offset, const char **why)
{
    mf_status_t st = mf_qkv_check(&a->src, 0, why);
    if (st != MF_OK)
        return st;
    uint32_t b = a->block_size;
    if (b < MF_ROW_MIN_BLOCK || b > MF_ROW_MAX_BLOCK || (b & (b - 1))) {
        *why = "block size must be a power of two in [8, 256]";
        return MF_INVALID_ARGUMENT;
    }
    if (!(a->top_p > 0.0f && a->top_p <= 1.0f)) {
        *why = "top_p must be in (0, 1]";
        return MF_INVALID_ARGUMENT;
    }
    if ((unsigned)a->codec >= MF_CODEC_COUNT) {
        *why = "unknown codec";
        return MF_INVALID_ARGUMENT;
    }
    if (a->i0 >= a->i1 || a->i1 > a->src.n_tokens / b) {
        *why = "block range must satisfy i0 < i1 <= N / B (full blocks only)";
        return MF_INVALID_ARGUMENT;
    }
    if (!a->model || !a->ns || !a->tokens || !rows || !caps || !sizes) {
        *why = "model, namespace, tokens and row buffers are required";
        return MF_INVALID_ARGUMENT;
    }
    size_t ml = strlen(a->model);
    if (ml < 1 || ml > MF_ROW_MAX_MODEL) {
        *why = "model id must be 1..255 bytes";
        return MF_INVALID_ARGUMENT;
    }
    return mf_extract_options(a->fields, a->sample_stride, a->sample_offset, b, stride, offset,
                              why);
}

/* Which query rows of each block the masses are averaged over: q ≡ offset (mod stride). */
typedef struct sample {
    uint32_t stride, offset;
    int tiles;         /* the codec has tiles: every row's LSE is needed, sampled or not */
} sample_t;

/* Pass 1 for block i, head h: LSE of each query row (given or computed) and the masses. */
static void block_masses(const mf__staged_t *s, const float *lse_in, uint32_t b,
                         const sample_t *smp, uint32_t i, uint32_t h, extract_work_t *w,
                         uint32_t nb)
{
    double *mass = w->mass + (size_t)h * nb;
    memset(mass, 0, (i + 1) * sizeof(double));
    for (uint32_t q = 0; q < b; q++) {
        uint32_t r = i * b + q;
        double l;
        if (q % smp->stride != smp->offset) {
            if (smp->tiles)
                w->lse[(size_t)h * b + q] =
                    lse_in ? lse_in[(size_t)h * s->n + r]
                           : mf__attend_row(s, h, r, NULL, 1, w->scores, NULL);
            continue;
        }
        if (lse_in) {
            const float *qv = s->q + ((size_t)r * s->hq + h) * s->d;
            uint32_t kv = h / s->group;
            l = lse_in[(size_t)h * s->n + r];
            for (uint32_t k = 0; k <= r; k++)
                w->scores[k] = exp(s->scale * ref_dot(qv, s->k + ((size_t)k * s->hkv + kv) *
                                                              s->d, s->d) - l);
        } else {
            /* mf__attend_row leaves the normalised probabilities in scores. */
            l = mf__attend_row(s, h, r, NULL, 1, w->scores, NULL);
        }
        w->lse[(size_t)h * b + q] = l;
        for (uint32_t k = 0; k <= r; k++)
            mass[k / b] += w->scores[k];
    }
    for (uint32_t j = 0; j <= i; j++)
        mass[j] /= b / smp->stride;
}

/* Pass 2: P of (head h, query block i, key block j) into tile (row-major [q][k]). */
static void block_tile(const mf__staged_t *s, uint32_t b, uint32_t i, uint32_t j, uint32_t h,
                       const extract_work_t *w)
{
    uint32_t kv = h / s->group;
    for (uint32_t q = 0; q < b; q++) {
        uint32_t r = i * b + q;
        const float *qv = s->q + ((size_t)r * s->hq + h) * s->d;
        double l = w->lse[(size_t)h * b + q];
        for (uint32_t kk = 0; kk < b; kk++) {
            uint32_t k = j * b + kk;
            float p = 0.0f;
            if (k <= r)
                p = (float)exp(s->scale * ref_dot(qv, s->k + ((size_t)k * s->hkv + kv) * s->d,
                                                  s->d) - l);
            if (p > 1.0f) /* a given LSE slightly below the true one; scales must be ≤ 1 */
                p = 1.0f;
            w->tile[(size_t)q * b + kk] = p;
        }
    }
}

static float clamp01(double x)
{
    return x < 0 ? 0.0f : x > 1 ? 1.0f : (float)x;
}

mf_status_t mf_extract_ref(const mf_extract_args_t *a, void *const *rows, const size_t *caps,
                           size_t *sizes, uint32_t *failed_block, const char **why)
{
    const char *dummy;
    mf__staged_t s;
    extract_work_t w;
    if (!why)
        why = &dummy;
    *why = "";
    if (!a) {
        *why = "null arguments";
        return MF_INVALID_ARGUMENT;
    }
    sample_t smp = { .tiles = a->codec != MF_CODEC_MASK };
    mf_status_t st = check_args(a, rows, caps, sizes, &smp.stride, &smp.offset, why);
    if (st != MF_OK)
        return st;
    st = mf__stage(&a->src, 0, &s, why);
    if (st != MF_OK)
        return st;
    uint32_t b = a->block_size, hq = s.hq, nb = a->i1;
    st = work_alloc(&w, hq, nb, b, s.n);
    if (st != MF_OK) {
        *why = "out of memory for extract scratch";
        goto out_stage;
    }
    w.hash[0] = mf_hash_root(b, a->ns, strlen(a->ns), a->model, strlen(a->model));
    for (uint32_t x = 0; x < nb; x++)
        w.hash[x + 1] = mf_hash_next(w.hash[x], a->tokens + (size_t)x * b, b);

    for (uint32_t i = a->i0; i < a->i1; i++) {
        size_t k = i - a->i0;
        for (uint32_t h = 0; h < hq; h++) {
            uint32_t kept;
            block_masses(&s, a->lse, b, &smp, i, h, &w, nb);
            st = mf_topp_select(w.mass + (size_t)h * nb, NULL, i + 1, a->top_p,
                                w.keep + (size_t)h * nb, &kept);
            if (st != MF_OK) {
                *why = "top-p selection failed";
                goto out_work;
            }
        }
        uint32_t n_cols = 0;
        for (uint32_t j = 0; j <= i; j++) {
            uint64_t m = 0;
            for (uint32_t h = 0; h < hq; h++)
                if (w.keep[(size_t)h * nb + j])
                    m |= 1ull << h;
            if (m) {
                w.cols[n_cols] = j;
                w.mask[n_cols++] = m;
            }
        }
        mf_row_spec_t spec = {
            .model = a->model, .layer = a->layer, .block_index = i, .block_size = b,
            .n_heads = hq, .codec = a->codec, .top_p = a->top_p, .parent = w.hash[i],
            .hash = w.hash[i + 1], .tokens = a->tokens + (size_t)i * b,
        };
        mf_row_wview_t wv;
        st = mf_row_init(rows[k], caps[k], &spec, n_cols, w.cols, w.mask, &wv, why);
        if (st != MF_OK) {
            if (st == MF_RESOURCE_EXHAUSTED)
                sizes[k] = wv.size;
            if (failed_block)
                *failed_block = i;
            goto out_work;
        }
        uint32_t e = 0;
        for (uint32_t c = 0; c < n_cols; c++)
            for (uint32_t h = 0; h < hq; h++) {
                if (!((w.mask[c] >> h) & 1u))
                    continue;
                wv.mass[e] = mf_mass_encode(clamp01(w.mass[(size_t)h * nb + w.cols[c]]));
                if (wv.tiles) {
                    block_tile(&s, b, i, w.cols[c], h, &w);
                    float sc = mf_tile_encode(a->codec, b, w.tile,
                                              (uint8_t *)wv.tiles + (size_t)e * wv.tile_bytes);
                    if (wv.scales)
                        wv.scales[e] = sc;
                }
                e++;
            }
        mf_row_seal(rows[k], wv.size);
        sizes[k] = wv.size;
    }
    st = MF_OK;
out_work:
    work_free(&w);
out_stage:
    mf__unstage(&s);
    return st;
}

/* The put path's row copy (mapflow_kernels.h); *max_size: the largest size, for the CUDA
 * launcher's grid. */
mf_status_t mf_rows_copy_check(void *const *dst, const void *const *src, const size_t *sizes,
                               uint32_t n, size_t *max_size, const char **why)
{
    const char *dummy;
    if (!why)
        why = &dummy;
    *why = "";
    size_t mx = 0;
    if (n > MF_ROWS_COPY_MAX) {
        *why = "more than MF_ROWS_COPY_MAX rows in one copy";
        return MF_INVALID_ARGUMENT;
    }
    if (n > 0 && (!dst || !src || !sizes)) {
        *why = "dst, src and sizes are required";
        return MF_INVALID_ARGUMENT;
    }
    for (uint32_t x = 0; x < n; x++) {
        size_t z = sizes[x];
        if (z > MF_ROW_MAX_BYTES) {
            *why = "a row size exceeds MF_ROW_MAX_BYTES";
            return MF_INVALID_ARGUMENT;
        }
        if (z == 0)
            continue;
        uintptr_t d = (uintptr_t)dst[x], s = (uintptr_t)src[x];
        if (!d || !s) {
            *why = "a row with bytes to copy has no source or destination";
            return MF_INVALID_ARGUMENT;
        }
        if (d > UINTPTR_MAX - z || s > UINTPTR_MAX - z || (d < s + z && s < d + z)) {
            *why = "a row's source and destination overlap (or wrap the address space)";
            return MF_INVALID_ARGUMENT;
        }
        if (z > mx)
            mx = z;
    }
    if (max_size)
        *max_size = mx;
    return MF_OK;
}

mf_status_t mf_rows_copy_ref(void *const *dst, const void *const *src, const size_t *sizes,
                             uint32_t n, const char **why)
{
    mf_status_t st = mf_rows_copy_check(dst, src, sizes, n, NULL, why);
    if (st != MF_OK)
        return st;
    for (uint32_t x = 0; x < n; x++)
        if (sizes[x])
            memcpy(dst[x], src[x], sizes[x]);
    return MF_OK;
}
