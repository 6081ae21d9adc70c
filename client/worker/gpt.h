/*
 * gpt — the forward pass of bench/quality/model.py's GPT on the CPU, in float32: pre-LN
 * blocks (LayerNorm eps 1e-5, fused qkv without bias, RoPE on (first half, second half) of
 * each head, causal softmax attention scaled 1/sqrt(d), exact-erf GELU MLP of width 4D),
 * final LayerNorm and logits through the tied embedding.
 *
 * Weights: safetensors (F16 / BF16 / F32, widened to float32 at load) named as the
 * PyTorch state_dict (emb.weight, blocks.I.{ln1,qkv,proj,ln2,fc,out}.*, lnf.*), the config
 * in __metadata__ (vocab, n_layer, n_head, d_model, ctx).
 *
 * A run (mfw_run_t) holds one sequence's KV cache; mfw_gpt_forward appends tokens to it
 * (a prefill, then one token per decode step). Each layer's attention goes through a
 * hook, so a worker can extract map rows from Q and K (source) or replace attention by
 * mf_apply (target); without a hook it is mfw_attention().
 *
 * Ownership: the model owns its weights, a run its cache; hook arguments point into the
 * run's buffers and are valid during the call only. Thread safety: a model is read-only
 * after load (share it); a run belongs to one thread at a time.
 */
#ifndef MFW_GPT_H
#define MFW_GPT_H

#include <stddef.h>
#include <stdint.h>

#include "mf_status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mfw_gpt_cfg {
    uint32_t vocab, n_layer, n_head, d_model, head_dim, ctx;
} mfw_gpt_cfg_t;

typedef struct mfw_gpt mfw_gpt_t;
typedef struct mfw_run mfw_run_t;

/* Bounds checked at load: vocab ≤ 1 << 20, layers ≤ 256, heads ≤ 64, d_model ≤ 8192. */
mf_status_t mfw_gpt_load(const char *path, mfw_gpt_t **out, char *err, size_t errlen);
void mfw_gpt_free(mfw_gpt_t *m);
const mfw_gpt_cfg_t *mfw_gpt_cfg(const mfw_gpt_t *m);

/* A run for up to max_tokens tokens (≤ 1 << 20). */
mf_status_t mfw_run_create(const mfw_gpt_t *m, uint32_t max_tokens, mfw_run_t **out);
void mfw_run_free(mfw_run_t *r);
uint32_t mfw_run_len(const mfw_run_t *r);

/* One layer's attention within a forward call over positions [pos0, pos0 + n). */
typedef struct mfw_attn_args {
    uint32_t layer, pos0, n, n_heads, head_dim;
    const float *q;          /* [n, H, d] this call's rows, after RoPE */
    const float *k, *v;      /* [pos0 + n, H, d] every cached row, after RoPE (k) */
    float *o;                /* out [n, H, d] */
} mfw_attn_args_t;

typedef mf_status_t (*mfw_attn_fn)(void *ctx, const mfw_attn_args_t *a);

/* Causal softmax attention of a's rows (the default, and a hook's fallback). */
mf_status_t mfw_attention(const mfw_attn_args_t *a);

/*
 * Runs tokens[0..n) at the run's next positions. logits (may be NULL) receives
 * [n - logits_from, vocab] for this call's rows logits_from..n−1. attn NULL: default.
 * MF_OUT_OF_RANGE past max_tokens; MF_INVALID_ARGUMENT for a token ≥ vocab; a hook's
 * failure is returned as is (the run is then unusable).
 */
mf_status_t mfw_gpt_forward(const mfw_gpt_t *m, mfw_run_t *r, const uint32_t *tokens,
                            uint32_t n, mfw_attn_fn attn, void *ctx, uint32_t logits_from,
                            float *logits);

/* Read-only views of the float32 weights in PyTorch layouts (a Linear is [out, in]), for
 * another backend to upload (gpt_cuda.h); valid while the model lives. */
typedef struct mfw_gpt_layer_view {
    const float *ln1_w, *ln1_b, *qkv, *proj, *ln2_w, *ln2_b, *fc, *out;
} mfw_gpt_layer_view_t;

typedef struct mfw_gpt_view {
    const float *emb, *lnf_w, *lnf_b;   /* [vocab, D], [D], [D] */
    const float *rope_inv;              /* [head_dim / 2] */
} mfw_gpt_view_t;

void mfw_gpt_view(const mfw_gpt_t *m, mfw_gpt_view_t *v);
void mfw_gpt_layer_view(const mfw_gpt_t *m, uint32_t layer, mfw_gpt_layer_view_t *v);

#ifdef __cplusplus
}
#endif
#endif /* MFW_GPT_H */
