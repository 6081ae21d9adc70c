/* handoff — see handoff.h. */
#include "handoff.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>


static void free_layer(mfw_extract_t *e, uint32_t l)
{
    for (uint32_t i = 0; e->rows[l] && i < e->n_blocks; i++)
        free(e->rows[l][i]);
    free(e->rows[l]);
    free(e->sizes[l]);
    e->rows[l] = NULL;
    e->sizes[l] = NULL;
}

void mfw_extract_release(mfw_extract_t *e)
{
    for (uint32_t l = 0; l < MFW_MAX_LAYERS; l++)
        free_layer(e, l);
}

mf_status_t mfw_extract_alloc(mfw_extract_t *e, uint32_t layer, uint32_t n_blocks,
                              uint32_t n_heads, size_t *caps, int host_rows)
{
    free_layer(e, layer);
    e->n_blocks = n_blocks;
    e->sizes[layer] = calloc(n_blocks, sizeof(size_t));
    if (!e->sizes[layer] || (host_rows && !(e->rows[layer] = calloc(n_blocks, sizeof(void *)))))
        return MF_RESOURCE_EXHAUSTED;
    size_t mlen = strlen(e->model);
    for (uint32_t i = 0; i < n_blocks; i++) {
        caps[i] = mf_extract_row_bound(e->codec[layer], e->block_size, n_heads, i, mlen);
        if (!caps[i])
            return MF_INVALID_ARGUMENT;
        if (host_rows && !(e->rows[layer][i] = aligned_alloc(16, (caps[i] + 15) & ~(size_t)15)))
            return MF_RESOURCE_EXHAUSTED;
    }
    return MF_OK;
}

int mfw_extract_wants(const mfw_extract_t *e, uint32_t layer, uint32_t pos0, uint32_t n)
{
    return pos0 == 0 && layer < MFW_MAX_LAYERS && e->want[layer] && n >= e->block_size;
}

mf_status_t mfw_extract_hook(void *ctx, const mfw_attn_args_t *a)
{
    mfw_extract_t *e = ctx;
    mf_status_t st = mfw_attention(a);
    if (st != MF_OK || !mfw_extract_wants(e, a->layer, a->pos0, a->n))
        return st;
    uint32_t nb = a->n / e->block_size, l = a->layer;
    size_t *caps = calloc(nb, sizeof(size_t));
    if (!caps || (st = mfw_extract_alloc(e, l, nb, a->n_heads, caps, 1)) != MF_OK) {
        free(caps);
        return caps ? st : MF_RESOURCE_EXHAUSTED;
    }
    mf_extract_args_t ea = { .src = { a->q, a->k, NULL, MF_DTYPE_F32, a->n, a->n_heads,
                                      a->n_heads, a->head_dim },
                             .block_size = e->block_size, .top_p = e->top_p, .codec = e->codec[l],
                             .i0 = 0, .i1 = nb, .model = e->model, .ns = e->ns, .layer = l,
                             .tokens = e->tokens };
    uint32_t failed = 0;
    double t0 = mf_now_s();
    st = mf_extract_ref(&ea, e->rows[l], caps, e->sizes[l], &failed, &e->why);
    e->seconds += mf_now_s() - t0;
    for (uint32_t i = 0; st == MF_OK && i < nb; i++) {
        mf_row_view_t rv;
        if (mf_row_decode(e->rows[l][i], e->sizes[l][i], MF_ROW_NO_CHECKSUM, &rv, NULL) == MF_OK)
            e->entries += rv.n_entries;
    }
    free(caps);
    return st;
}

mf_status_t mfw_extract_plan(mfw_extract_t *e, const Mapflow__V1__MappingProfile *p,
                             mf_codec_t prob_codec, const mf_codec_t *force, uint32_t n_layer,
                             mf_export_layer_t *plan, uint32_t *n, const char **why)
{
    mf_status_t st = mf_profile_export_plan(p, prob_codec, plan, MFW_MAX_LAYERS, n, why);
    if (st != MF_OK)
        return st;
    if (force && (unsigned)*force >= MF_CODEC_COUNT) {
        if (why)
            *why = "unknown codec";
        return MF_INVALID_ARGUMENT;
    }
    for (uint32_t i = 0; i < *n; i++) {
        uint32_t l = plan[i].source_layer;
        if (force)
            plan[i].codec = *force;
        if (l < n_layer && l < MFW_MAX_LAYERS) {
            e->want[l] = 1;
            e->codec[l] = plan[i].codec;
        }
    }
    return MF_OK;
}

mf_status_t mfw_reuse_layer(mfw_reuse_t *r, uint32_t layer, uint32_t pos0, uint32_t n_heads,
                            const Mapflow__V1__LayerMap **lm, mf_layer_map_t *map,
                            uint8_t modes[64], float tops[64])
{
    *lm = pos0 == 0 && r->n_rows ? mf_profile_layer(r->profile, layer) : NULL;
    if (!*lm || (*lm)->source_layer >= MFW_MAX_LAYERS || !r->rows[(*lm)->source_layer]) {
        *lm = NULL;
        return MF_OK;
    }
    mf_status_t st = mf_layer_map_from_proto(*lm, map, modes, tops);
    if (st != MF_OK || map->n_target_heads != n_heads) {
        r->why = "profile layer does not fit the target's heads";
        return st != MF_OK ? st : MF_FAILED_PRECONDITION;
    }
    return MF_OK;
}

mf_status_t mfw_reuse_hook(void *ctx, const mfw_attn_args_t *a)
{
    mfw_reuse_t *r = ctx;
    const Mapflow__V1__LayerMap *lm;
    uint8_t modes[64];
    float tops[64];
    mf_layer_map_t map;
    mf_status_t st = mfw_reuse_layer(r, a->layer, a->pos0, a->n_heads, &lm, &map, modes, tops);
    if (st != MF_OK || !lm)
        return st != MF_OK ? st : mfw_attention(a);
    const Mapflow__V1__RecomputePolicy *rp = r->profile->recompute;
    mf_apply_args_t aa = { .rows = r->rows[lm->source_layer], .n_rows = r->n_rows, .map = &map,
                           .tgt = { a->q, a->k, a->v, MF_DTYPE_F32, a->n, a->n_heads,
                                    a->n_heads, a->head_dim },
                           .block_size = r->profile->block_size,
                           .exact_first = rp ? rp->first_blocks : 0,
                           .exact_last = rp ? rp->last_blocks : 0, .o = a->o };
    mf_apply_stats_t s = { 0 };
    double t0 = mf_now_s();
    st = mf_apply_ref(&aa, &s, &r->why);
    r->seconds += mf_now_s() - t0;
    r->stats.exact_blocks += s.exact_blocks;
    r->stats.prob_tiles += s.prob_tiles;
    r->stats.mask_blocks += s.mask_blocks;
    r->stats.mask_candidates += s.mask_candidates;
    r->layers_mapped += st == MF_OK;
    return st;
}
