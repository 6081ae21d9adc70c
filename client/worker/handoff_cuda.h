/*
 * handoff_cuda — the CUDA twins of handoff.h's hooks (mapflow-worker --device cuda), with
 * the same contexts, so the worker's source / target code is the same on both devices:
 *  - source: default attention, then mf_extract_cuda writes the rows of a wanted layer into
 *    device buffers, which stay there (e->dev_rows) for mf_put_device_batch (copied device
 *    to device into the daemon's GPU arena, or staged by libmapflow); where the channel
 *    has no GPU, mfw_extract_cuda_to_host brings them over for mf_put_batch;
 *  - target: rows leased on the device (r->dev_in, the daemon's GPU arena) are used in
 *    place; the others (host arena views) are copied to the device once before the
 *    prefill (mfw_reuse_cuda_upload: one gather, one copy); a mapped layer then runs
 *    mf_apply_cuda over them, the recompute policy exact; anything else mfw_cuda_attention.
 *
 * Ownership: device buffers belong to their context (e->dev_mem until
 * mfw_extract_cuda_release; r->dev_rows, r->dev_mem until mfw_reuse_cuda_release).
 * Thread safety: as handoff.h (one context per forward call / thread).
 */
#ifndef MFW_HANDOFF_CUDA_H
#define MFW_HANDOFF_CUDA_H

#include "gpt_cuda.h"
#include "handoff.h"

/* mfw_cuda_attn_fn; ctx is a mfw_extract_t. e->seconds: the extract kernel (synchronised),
 * e->entries from the rows' headers. */
mf_status_t mfw_extract_cuda_hook(void *ctx, const mfw_cuda_attn_args_t *a);
/* Copies the device rows into host rows (e->rows) and frees the device ones. */
mf_status_t mfw_extract_cuda_to_host(mfw_extract_t *e);
void mfw_extract_cuda_release(mfw_extract_t *e);

/* Puts every row on the device: r->dev_rows[layer][block] = r->dev_in's address, or a
 * copy (in r->dev_mem) of r->rows' host view; counts in rows_on_device / rows_copied. */
mf_status_t mfw_reuse_cuda_upload(mfw_reuse_t *r);
void mfw_reuse_cuda_release(mfw_reuse_t *r);

/* mfw_cuda_attn_fn; ctx is a mfw_reuse_t after mfw_reuse_cuda_upload. r->seconds: the
 * mf_apply_cuda calls (synchronised). r->stats stays 0: the CUDA kernel counts nothing. */
mf_status_t mfw_reuse_cuda_hook(void *ctx, const mfw_cuda_attn_args_t *a);

#endif /* MFW_HANDOFF_CUDA_H */
