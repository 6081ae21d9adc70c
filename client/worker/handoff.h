/*
 * handoff — the two attention hooks of mapflow-worker (DESIGN §1): on the source, extract
 * map rows from a prefill's Q and K (mf_extract_ref) for the layers a profile needs; on the
 * target, replace a mapped layer's prefill attention by mf_apply_ref over the fetched rows
 * (layers below L0, decode steps and layers without rows stay mfw_attention).
 *
 * Ownership: mfw_extract_t owns the row buffers it allocates (freed by
 * mfw_extract_release); everything a mfw_reuse_t points to belongs to the caller and must
 * outlive the forward call. Thread safety: one context per forward call / thread.
 */
#ifndef MFW_HANDOFF_H
#define MFW_HANDOFF_H

#include <stdint.h>

#include "gpt.h"
#include "mapflow.h"
#include "mf_clock.h"
#include "mapflow.pb-c.h"
#include "mapflow_kernels.h"
#include "mf_profile.h"

#define MFW_MAX_LAYERS 256u

typedef struct mfw_extract {
    /* in */
    uint8_t want[MFW_MAX_LAYERS];   /* nonzero: extract this layer */
    mf_codec_t codec[MFW_MAX_LAYERS]; /* a wanted layer's row codec (mfw_extract_plan) */
    uint32_t block_size;
    float top_p;
    const char *model, *ns;
    const uint32_t *tokens;         /* the prefill's tokens */
    /* out: rows[layer][block], 16-byte aligned, sizes[layer][block] bytes */
    uint32_t n_blocks;
    void **rows[MFW_MAX_LAYERS];
    size_t *sizes[MFW_MAX_LAYERS];
    uint64_t entries;               /* (column, head) entries over all rows */
    double seconds;                 /* spent in mf_extract_ref */
    const char *why;                /* the kernel's message on failure */
    /* CUDA hook only (handoff_cuda.h): the rows stay on the device, dev_rows[layer][block]
     * inside dev_mem[layer]; rows[layer] are then NULL, sizes[layer] still set */
    void **dev_rows[MFW_MAX_LAYERS];
    void *dev_mem[MFW_MAX_LAYERS];
    /* CUDA hook, in: a channel with a mapped GPU arena, or NULL. Set, each wanted layer's
     * rows are written straight into a put region reserved by capacity (region[layer],
     * dev_rows its addresses, its lengths set from the kernel's sizes): the caller
     * commits it. A daemon refusing a region (no GPU tier or room, bounds beyond one
     * arena) leaves region[layer] NULL and the rows in dev_mem, for mf_put_device_batch. */
    mf_channel_t *region_ch;
    mf_put_region_t *region[MFW_MAX_LAYERS];
    char region_why[256];           /* the last refusal's message ("" when none) */
} mfw_extract_t;

/* mfw_attn_fn: default attention, then (prefill from position 0 only) rows for every
 * full block of a wanted layer. ctx is a mfw_extract_t. */
mf_status_t mfw_extract_hook(void *ctx, const mfw_attn_args_t *a);
void mfw_extract_release(mfw_extract_t *e);

/* Whether a forward call's layer gets rows: a prefill from position 0 of a wanted layer
 * with at least one full block (shared by the CPU and CUDA hooks). */
int mfw_extract_wants(const mfw_extract_t *e, uint32_t layer, uint32_t pos0, uint32_t n);

/* (Re)allocates layer's sizes[n_blocks] and, with host_rows, its n_blocks host row
 * buffers (16-byte aligned); caps[n_blocks] receives each row's bound
 * (mf_extract_row_bound), the buffers' capacity. */
mf_status_t mfw_extract_alloc(mfw_extract_t *e, uint32_t layer, uint32_t n_blocks,
                              uint32_t n_heads, size_t *caps, int host_rows);

/* Wants the layers of a profile's export plan (mf_profile_export_plan: mask rows, prob
 * rows in prob_codec where a head reads tiles) that lie below n_layer, each with its plan
 * codec, or with *force when force is not NULL (one codec for every layer). The plan goes
 * to plan[MFW_MAX_LAYERS], its length to *n (layers ≥ n_layer included, not wanted). */
mf_status_t mfw_extract_plan(mfw_extract_t *e, const Mapflow__V1__MappingProfile *p,
                             mf_codec_t prob_codec, const mf_codec_t *force, uint32_t n_layer,
                             mf_export_layer_t *plan, uint32_t *n, const char **why);

typedef struct mfw_reuse {
    /* in */
    const Mapflow__V1__MappingProfile *profile;
    uint32_t n_rows;                /* query blocks with rows (the lookup's hit) */
    const mf_row_view_t *const *rows[MFW_MAX_LAYERS]; /* by source layer: [n_rows] or NULL */
    /* rows leased on the device (the daemon's GPU arena, CUDA backend only), by source
     * layer: [n_rows] device addresses (NULL: see rows) or NULL; rows[layer] must then
     * be set too (its entries NULL for these) */
    const void *const *dev_in[MFW_MAX_LAYERS];
    /* CUDA backend only (handoff_cuda.h): every row on the device, by source layer: host
     * arrays [n_rows] of device addresses (dev_in's, or copies in dev_mem) */
    const void **dev_rows[MFW_MAX_LAYERS];
    void *dev_mem;
    uint32_t rows_on_device, rows_copied; /* of those: leased in place, copied from host */
    /* out */
    mf_apply_stats_t stats;
    uint32_t layers_mapped;
    double seconds;                 /* spent in mf_apply_ref */
    const char *why;
} mfw_reuse_t;

/* mfw_attn_fn: a prefill from position 0 of a layer the profile maps, with rows, runs
 * mf_apply_ref (per-head prob / mask / compute, the recompute policy exact); anything
 * else mfw_attention. ctx is a mfw_reuse_t. */
mf_status_t mfw_reuse_hook(void *ctx, const mfw_attn_args_t *a);

/* The profile entry of a forward call's layer (shared by the CPU and CUDA hooks): *lm is
 * NULL when the layer is computed normally (not a prefill from 0, not mapped, no rows);
 * else map (with modes[64], tops[64] behind it) is that layer's mapping. A profile that
 * does not fit the target's heads fails (r->why). */
mf_status_t mfw_reuse_layer(mfw_reuse_t *r, uint32_t layer, uint32_t pos0, uint32_t n_heads,
                            const Mapflow__V1__LayerMap **lm, mf_layer_map_t *map,
                            uint8_t modes[64], float tops[64]);


#endif /* MFW_HANDOFF_H */
