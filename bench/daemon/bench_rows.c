/* bench_rows — seeded contexts and production-shaped map rows for the benchmark. */
#include "bench_rows.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "mf_codec.h"

#define VOCAB 151936u
/* Distinct random tiles the FP8 rows cycle through: enough that no two neighbouring
 * entries share bytes, small enough to build once. */
#define TILE_POOL 61u

/* Encoded FP8 tiles (and their scales) the rows cycle through: encoding 4096 elements
 * per entry for millions of entries would dominate the run, and the bytes are the
 * codec's real output either way. Built on first use for one block size. */
static uint8_t *tile_pool;
static float tile_scale[TILE_POOL];
static uint32_t tile_pool_b;
static mf_codec_t tile_pool_codec;

mf_status_t mfb_context_init(mfb_context_t *cx, const char *ns, const char *model,
                             uint32_t block_size, size_t n_tokens, uint64_t seed)
{
    memset(cx, 0, sizeof(*cx));
    if (strlen(ns) >= sizeof(cx->ns) || strlen(model) >= sizeof(cx->model) || !block_size)
        return MF_INVALID_ARGUMENT;
    strcpy(cx->ns, ns);
    strcpy(cx->model, model);
    cx->block_size = block_size;
    cx->n_tokens = n_tokens;
    cx->n_blocks = n_tokens / block_size;
    cx->tokens = malloc((n_tokens ? n_tokens : 1) * sizeof(uint32_t));
    cx->hashes = malloc((cx->n_blocks ? cx->n_blocks : 1) * sizeof(mf_hash128_t));
    if (!cx->tokens || !cx->hashes) {
        mfb_context_free(cx);
        return MF_RESOURCE_EXHAUSTED;
    }
    uint64_t rng = seed;
    for (size_t i = 0; i < n_tokens; i++)
        cx->tokens[i] = (uint32_t)(mfb_rand(&rng) % VOCAB);
    size_t got = 0;
    mf_status_t st = mf_hash_prefix(ns, model, block_size, cx->tokens, n_tokens, cx->hashes,
                                    cx->n_blocks, &got);
    if (st != MF_OK || got != cx->n_blocks) {
        mfb_context_free(cx);
        return st != MF_OK ? st : MF_INTERNAL;
    }
    return MF_OK;
}

void mfb_context_free(mfb_context_t *cx)
{
    free(cx->tokens);
    free(cx->hashes);
    cx->tokens = NULL;
    cx->hashes = NULL;
}

/* Random attention-like tiles (never all zeros, skewed towards small values), encoded
 * once with the row's codec. */
static mf_status_t tile_pool_build(mf_codec_t codec, uint32_t b)
{
    if (tile_pool && tile_pool_b == b && tile_pool_codec == codec)
        return MF_OK;
    size_t per = (size_t)b * b;
    mf_row_layout_t lay;
    if (mf_row_layout(codec, b, 1, 1, 1, 1, &lay) != MF_OK)
        return MF_INVALID_ARGUMENT;
    float *src = malloc(per * sizeof(float));
    uint8_t *pool = malloc(TILE_POOL * lay.tile_bytes);
    if (!src || !pool) {
        free(src);
        free(pool);
        return MF_RESOURCE_EXHAUSTED;
    }
    uint64_t rng = 0x711e5ull;
    for (uint32_t t = 0; t < TILE_POOL; t++) {
        for (size_t k = 0; k < per; k++) {
            double u = mfb_rand01(&rng);
            src[k] = (float)(u * u * 4.0 / b);
        }
        tile_scale[t] = mf_tile_encode(codec, b, src, pool + t * lay.tile_bytes);
    }
    free(src);
    free(tile_pool);
    tile_pool = pool;
    tile_pool_b = b;
    tile_pool_codec = codec;
    return MF_OK;
}

/* Kept key blocks per head: sink 0 and diagonal i always, then distinct random
 * j in [1, i) until `keep` blocks. Fills head_mask[j] over j = 0..i. */
static void choose_blocks(uint32_t i, uint32_t n_heads, double density, uint64_t *rng,
                          uint64_t *mask_by_j, uint32_t *scratch)
{
    uint32_t avail = i + 1;
    uint32_t keep = (uint32_t)lround(density * avail);
    if (keep < 2)
        keep = 2;
    if (keep > avail)
        keep = avail;
    for (uint32_t h = 0; h < n_heads; h++) {
        uint64_t bit = 1ull << h;
        mask_by_j[0] |= bit;
        mask_by_j[i] |= bit;
        if (i < 2)
            continue;
        /* Partial Fisher–Yates over the inner blocks 1..i-1. */
        uint32_t inner = i - 1;
        for (uint32_t k = 0; k < inner; k++)
            scratch[k] = k + 1;
        uint32_t more = keep - 2;
        for (uint32_t k = 0; k < more && k < inner; k++) {
            uint32_t r = k + (uint32_t)(mfb_rand(rng) % (inner - k));
            uint32_t t = scratch[k];
            scratch[k] = scratch[r];
            scratch[r] = t;
            mask_by_j[scratch[k]] |= bit;
        }
    }
}

mf_status_t mfb_row_make(const mfb_context_t *cx, uint32_t layer, uint32_t block,
                         const mfb_row_shape_t *shape, mfb_row_t *out, const char **why)
{
    memset(out, 0, sizeof(*out));
    *why = "";
    if (block >= cx->n_blocks || shape->n_heads == 0 || shape->n_heads > 64) {
        *why = "block outside the context or bad head count";
        return MF_INVALID_ARGUMENT;
    }
    const uint32_t b = cx->block_size, n = block + 1;
    mf_status_t st = MF_RESOURCE_EXHAUSTED;
    uint64_t *mask_by_j = calloc(n, sizeof(uint64_t));
    uint32_t *scratch = malloc(n * sizeof(uint32_t));
    uint32_t *cols = malloc(n * sizeof(uint32_t));
    uint64_t *masks = malloc(n * sizeof(uint64_t));
    uint8_t *buf = NULL;
    if (!mask_by_j || !scratch || !cols || !masks)
        goto free_scratch;
    uint64_t rng = shape->seed ^ ((uint64_t)layer << 40) ^ ((uint64_t)block << 8);
    choose_blocks(block, shape->n_heads, shape->density, &rng, mask_by_j, scratch);
    uint32_t n_cols = 0, n_entries = 0;
    for (uint32_t j = 0; j < n; j++)
        if (mask_by_j[j]) {
            cols[n_cols] = j;
            masks[n_cols++] = mask_by_j[j];
            n_entries += (uint32_t)__builtin_popcountll(mask_by_j[j]);
        }
    if (shape->codec != MF_CODEC_MASK && (st = tile_pool_build(shape->codec, b)) != MF_OK)
        goto free_scratch;
    mf_row_spec_t spec = {
        .model = cx->model,
        .layer = layer,
        .block_index = block,
        .block_size = b,
        .n_heads = shape->n_heads,
        .codec = shape->codec,
        .top_p = 0.95f,
        .parent = block ? cx->hashes[block - 1]
                        : mf_hash_root(b, cx->ns, strlen(cx->ns), cx->model,
                                       strlen(cx->model)),
        .hash = cx->hashes[block],
        .tokens = cx->tokens + (size_t)block * b,
    };
    size_t size = 0;
    if ((st = mf_row_size(&spec, n_cols, masks, &size)) != MF_OK) {
        *why = "row shape out of bounds";
        goto free_scratch;
    }
    size_t cap = (size + 15) & ~(size_t)15;
    buf = aligned_alloc(16, cap);
    st = MF_RESOURCE_EXHAUSTED;
    if (!buf)
        goto free_scratch;
    /* mf_row_build, with the tiles taken from the encoded pool. */
    mf_row_wview_t wv;
    if ((st = mf_row_init(buf, cap, &spec, n_cols, cols, masks, &wv, why)) != MF_OK)
        goto free_buf;
    uint32_t first = (uint32_t)(mfb_rand(&rng) % TILE_POOL);
    for (uint32_t e = 0; e < wv.n_entries; e++) {
        wv.mass[e] = mf_mass_encode((float)(0.001 + 0.999 * mfb_rand01(&rng)));
        if (wv.tiles) {
            uint32_t t = (first + e) % TILE_POOL;
            memcpy((uint8_t *)wv.tiles + (size_t)e * wv.tile_bytes,
                   tile_pool + (size_t)t * wv.tile_bytes, wv.tile_bytes);
            if (wv.scales)
                wv.scales[e] = tile_scale[t];
        }
    }
    if ((st = mf_row_seal(buf, wv.size)) != MF_OK)
        goto free_buf;
    out->data = buf;
    out->len = wv.size;
    out->layer = layer;
    out->block = block;
    out->hash = cx->hashes[block];
    out->n_entries = n_entries;
    goto free_scratch;
free_buf:
    free(buf);
free_scratch:
    if (st == MF_RESOURCE_EXHAUSTED && !**why)
        *why = "out of memory";
    free(masks);
    free(cols);
    free(scratch);
    free(mask_by_j);
    return st;
}

void mfb_row_free(mfb_row_t *r)
{
    free(r->data);
    r->data = NULL;
}

static mf_status_t rows_alloc(mfb_row_t **rows, size_t n)
{
    *rows = calloc(n ? n : 1, sizeof(mfb_row_t));
    return *rows ? MF_OK : MF_RESOURCE_EXHAUSTED;
}

mf_status_t mfb_workload_build(mfb_workload_t *w, const mfb_workload_params_t *p,
                               const char **why)
{
    memset(w, 0, sizeof(*w));
    *why = "";
    mf_status_t st = mfb_context_init(&w->mask_cx, MFB_NS, "bench-mask", MFB_BLOCK,
                                      p->ctx_tokens, p->seed);
    if (st == MF_OK)
        st = mfb_context_init(&w->fp8_cx, MFB_NS, "bench-fp8", MFB_BLOCK, p->ctx_tokens,
                              p->seed);
    size_t nb = w->mask_cx.n_blocks;
    if (st == MF_OK && (nb == 0 || p->fp8_first_block >= nb || p->fp8_rows == 0)) {
        *why = "context too short for the FP8 block range";
        st = MF_INVALID_ARGUMENT;
    }
    if (st == MF_OK)
        st = rows_alloc(&w->mask, nb * p->mask_layers);
    if (st == MF_OK)
        st = rows_alloc(&w->fp8, (size_t)p->fp8_rows * p->fp8_layers);
    if (st != MF_OK)
        goto fail;
    w->mask_layers = p->mask_layers;
    mfb_row_shape_t mask_shape = {MFB_HEADS, 0.10, MF_CODEC_MASK, p->seed ^ 0x3a5c};
    mfb_row_shape_t fp8_shape = {MFB_HEADS, 0.10, MF_CODEC_FP8_E4M3, p->seed ^ 0xf8f8};
    for (uint32_t l = 0; l < p->mask_layers; l++)
        for (size_t i = 0; i < nb; i++) {
            mfb_row_t *r = &w->mask[l * nb + i];
            if ((st = mfb_row_make(&w->mask_cx, l, (uint32_t)i, &mask_shape, r, why)) != MF_OK)
                goto fail;
            w->n_mask++;
            w->mask_bytes += r->len;
        }
    uint32_t last = (uint32_t)nb - 1, first = p->fp8_first_block;
    for (uint32_t l = 0; l < p->fp8_layers; l++)
        for (uint32_t k = 0; k < p->fp8_rows; k++) {
            uint32_t blk = p->fp8_rows == 1
                               ? last
                               : first + (uint32_t)((uint64_t)k * (last - first) /
                                                    (p->fp8_rows - 1));
            mfb_row_t *r = &w->fp8[w->n_fp8];
            if ((st = mfb_row_make(&w->fp8_cx, l, blk, &fp8_shape, r, why)) != MF_OK)
                goto fail;
            w->n_fp8++;
            w->fp8_bytes += r->len;
            if (r->len > w->fp8_max_len)
                w->fp8_max_len = r->len;
            if (!w->fp8_min_len || r->len < w->fp8_min_len)
                w->fp8_min_len = r->len;
        }
    return MF_OK;
fail:
    mfb_workload_free(w);
    return st;
}

void mfb_workload_free(mfb_workload_t *w)
{
    for (size_t i = 0; i < w->n_mask; i++)
        mfb_row_free(&w->mask[i]);
    for (size_t i = 0; i < w->n_fp8; i++)
        mfb_row_free(&w->fp8[i]);
    free(w->mask);
    free(w->fp8);
    w->mask = w->fp8 = NULL;
    w->n_mask = w->n_fp8 = 0;
    mfb_context_free(&w->mask_cx);
    mfb_context_free(&w->fp8_cx);
}
