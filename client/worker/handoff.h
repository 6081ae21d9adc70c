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
#include "mapflow.pb-c.h"
#include "mapflow_kernels.h"

#define MFW_MAX_LAYERS 256u

typedef struct mfw_extract {
    /* in */
    uint8_t want[MFW_MAX_LAYERS];   /* nonzero: extract this layer */
    uint32_t block_size;
    float top_p;
    mf_codec_t codec;
    const char *model, *ns;
    const uint32_t *tokens;         /* the prefill's tokens */
    /* out: rows[layer][block], 16-byte aligned, sizes[layer][block] bytes */
    uint32_t n_blocks;
    void **rows[MFW_MAX_LAYERS];
    size_t *sizes[MFW_MAX_LAYERS];
    double seconds;                 /* spent in mf_extract_ref */
    const char *why;                /* the kernel's message on failure */
} mfw_extract_t;

/* mfw_attn_fn: default attention, then (prefill from position 0 only) rows for every
 * full block of a wanted layer. ctx is a mfw_extract_t. */
mf_status_t mfw_extract_hook(void *ctx, const mfw_attn_args_t *a);
void mfw_extract_release(mfw_extract_t *e);

/* The source layers a profile needs (sorted, unique); returns their count. */
uint32_t mfw_profile_source_layers(const Mapflow__V1__MappingProfile *p, uint32_t *layers,
                                   uint32_t max);

typedef struct mfw_reuse {
    /* in */
    const Mapflow__V1__MappingProfile *profile;
    uint32_t n_rows;                /* query blocks with rows (the lookup's hit) */
    const mf_row_view_t *const *rows[MFW_MAX_LAYERS]; /* by source layer: [n_rows] or NULL */
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

/* Monotonic clock in seconds (for the workers' timings). */
double mfw_now_s(void);

#endif /* MFW_HANDOFF_H */
