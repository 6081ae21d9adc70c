/*
 * demo_model — the synthetic model pair of `make demo`, until the real-model issue replaces
 * it. The source model has Hs heads of dimension d per layer (structured Q/K from
 * kernels/synth: local windows + sink, per-head widths); the target model has Ht heads of
 * dimension 2d whose logits are the average of two source heads' logits plus its own
 * content noise, seen through a random orthogonal basis — so the target's maps are close
 * to (but not exactly) mixtures of source maps, as between two models trained on the same
 * text. V is each model's own. Same seed → same tensors in every process.
 *
 * Ownership: callers own the arrays. Thread safety: pure; any thread.
 */
#ifndef DEMO_MODEL_H
#define DEMO_MODEL_H

#include <stdint.h>

#include "mf_status.h"

typedef struct demo_shape {
    uint32_t n_tokens;     /* N */
    uint32_t src_heads;    /* Hs */
    uint32_t tgt_heads;    /* Ht */
    uint32_t head_dim;     /* d (source); the target uses 2d */
    uint32_t layers;       /* both models */
    uint64_t seed;
} demo_shape_t;

/* The context's tokens (ids < 32000). */
void demo_tokens(const demo_shape_t *s, uint32_t *tokens);

/* Source layer: q, k, v [N, Hs, d] float32. */
mf_status_t demo_source_qkv(const demo_shape_t *s, uint32_t layer, float *q, float *k, float *v);

/* Target layer: q, k, v [N, Ht, 2d] float32, built from the source layer of the same index. */
mf_status_t demo_target_qkv(const demo_shape_t *s, uint32_t layer, float *q, float *k, float *v);

/* Which two source heads target head t of a layer averages (a == b: a single head). */
void demo_target_pair(const demo_shape_t *s, uint32_t layer, uint32_t t, uint32_t *a, uint32_t *b);

/* Opens a zero-copy (arena) channel to the daemon for worker `role`; on failure prints
 * why and returns NULL. */
struct mf_channel;
struct mf_channel *demo_connect(const char *daemon, const char *ns, const char *role);

#endif /* DEMO_MODEL_H */
