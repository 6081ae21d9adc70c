/*
 * gpt_cuda — gpt.h's forward pass on a CUDA GPU (mapflow-worker --device cuda). Same model,
 * same hooks, same results within fp16 rounding:
 *  - weights uploaded once as fp16 (exact for the committed fp16 checkpoints; a wider
 *    checkpoint is rounded), LayerNorm parameters, the residual stream, softmax and every
 *    accumulation in float32;
 *  - matmuls: our own small tensor-core kernel (WMMA m16n16k16, fp32 activations rounded
 *    to fp16 as they are staged, fp32 accumulate) with its epilogue fused (store, add to
 *    the residual, exact-erf GELU); no cuBLAS, so nothing beyond the static CUDA runtime
 *    and the driver is needed at run time;
 *  - embedding, LayerNorm, the qkv split with RoPE into the fp16 KV cache: small kernels
 *    here; logits are the final LayerNorm and one matmul with the tied embedding;
 *  - attention goes through a hook (handoff_cuda.h), Q, K, V fp16 on the device. The
 *    default, mfw_cuda_attention: a prefill from position 0 runs mf_apply_cuda in compute
 *    mode (dense causal, the kernel the target's reuse runs too), later calls (decode
 *    steps, chunks) a one-warp-per-(row, head) online-softmax kernel over the cache.
 * Needs what mf_apply_cuda needs: head dim 64 or 128 (mfw_gpt_cuda_load checks it).
 *
 * Ownership: a model owns its device weights, a run its stream, KV cache and scratch; hook
 * arguments point into the run and are valid during the call only. Every forward call is
 * synchronous (it returns once the stream is idle). Thread safety: a model is read-only
 * after load; a run belongs to one thread at a time; all of it uses the current device.
 */
#ifndef MFW_GPT_CUDA_H
#define MFW_GPT_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "gpt.h"
#include "mapflow_kernels_cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mfw_gpt_cuda mfw_gpt_cuda_t;
typedef struct mfw_run_cuda mfw_run_cuda_t;

/* 1 when a CUDA device can be used (a driver and at least one GPU); 0 with the reason. */
int mfw_cuda_usable(char *why, size_t whylen);

/* Uploads m's weights to the current device; MF_UNIMPLEMENTED when the model does not fit
 * the CUDA kernels. The device's ordinal goes to *device, its name to name. */
mf_status_t mfw_gpt_cuda_load(const mfw_gpt_t *m, mfw_gpt_cuda_t **out, int *device,
                              char *name, size_t namelen, char *err, size_t errlen);
void mfw_gpt_cuda_free(mfw_gpt_cuda_t *g);

/* A run for up to max_tokens tokens (≤ 1 << 20). */
mf_status_t mfw_run_cuda_create(const mfw_gpt_cuda_t *g, uint32_t max_tokens,
                                mfw_run_cuda_t **out);
void mfw_run_cuda_free(mfw_run_cuda_t *r);
/* Why the last failed call failed (CUDA errors, the default attention's kernel); "" if none. */
const char *mfw_run_cuda_error(const mfw_run_cuda_t *r);

/* One layer's attention within a forward call over positions [pos0, pos0 + n). */
typedef struct mfw_cuda_attn_args {
    uint32_t layer, pos0, n, n_heads, head_dim;
    const void *q;           /* device fp16 [n, H, d] this call's rows, after RoPE */
    const void *k, *v;       /* device fp16 [pos0 + n, H, d] the cache, after RoPE (k) */
    float *o;                /* device out [n, H, d] float32 */
    mf_cuda_stream_t stream; /* the run's: queue work here */
} mfw_cuda_attn_args_t;

typedef mf_status_t (*mfw_cuda_attn_fn)(void *ctx, const mfw_cuda_attn_args_t *a);

/* Causal softmax attention of a's rows (the default, and a hook's fallback); queued on
 * a->stream. *why (static string) on failure. */
mf_status_t mfw_cuda_attention(const mfw_cuda_attn_args_t *a, const char **why);

/* As mfw_gpt_forward (same errors); logits is host memory. */
mf_status_t mfw_gpt_cuda_forward(const mfw_gpt_cuda_t *g, mfw_run_cuda_t *r,
                                 const uint32_t *tokens, uint32_t n, mfw_cuda_attn_fn attn,
                                 void *ctx, uint32_t logits_from, float *logits);

#ifdef __cplusplus
}
#endif
#endif /* MFW_GPT_CUDA_H */
