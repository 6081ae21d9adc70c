/*
 * calibrate — fits a mapping profile (DESIGN §6) from sample attention maps of a source
 * and a target model on the same sequences.
 *
 * For each target layer t and source layer l, and each target head h, it solves
 *     min_w  Σ_seq Σ_{k ≤ q} (A_t[h,q,k] − Σ_s w_s · A_l[s,q,k])²,   w ≥ 0, Σ w = 1
 * (projected gradient, FISTA, onto the simplex) from sufficient statistics accumulated
 * over sequences (Gram matrices of the source heads, cross products, target norms), so
 * memory does not grow with the sample count. Errors are relative L2 over the causal
 * entries: head error sqrt(residual / ||A_t[h]||²), layer error over all heads together.
 * The best source layer is the one with the lowest layer error. The IAM-style baseline
 * gives each target head its single most cosine-similar source head of the same layer.
 *
 * Modes (per target head): prob if the head error < prob_max_error and the layer error
 * ≤ max_error (prob mode serves the mixed map itself, so it needs a close fit). Else mask
 * if the head's mask recall ≥ mask_min_recall: mask mode only uses the mixed masses to
 * pick blocks and then attends exactly with the target's own Q, K, V, so what matters is
 * how much of the target head's own attention mass the picked blocks hold, not the L2
 * error of the mixed map (round 1 of issue 8: the L2 rule sent heads to compute that mask
 * mode served well). Recall = Σ target block mass inside the blocks mask mode attends /
 * Σ target block mass, over the full query blocks i ≥ 1 (block size block_size) of every
 * calibration sequence; candidates = blocks kept by a source head with w > 0 at its own
 * Top-P mask_top_p (the rows' columns), selection = Top-P over Σ w_s·mass_s (the apply
 * kernel's rule). With per_head_top_p each mask head gets the smallest target Top-P of a
 * fixed grid (0.5 … 1.0) that reaches the recall; else every mask head uses mask_top_p.
 * Otherwise compute. L0 = the first layer ≥ min_l0 with a head that is not computed
 * (every layer before it is computed).
 *
 * Objective (opts.objective): MF_CALIB_MAPS (default) fits W to the maps as above;
 * MF_CALIB_OUTPUTS fits W to the head OUTPUTS O = A·V with the target's own V (what prob
 * mode changes: a map error on keys whose values are alike costs nothing, a small one on
 * an outlier value costs a lot): min_w Σ_q ‖(A_t[h,q,:] − Σ_s w_s A_l[s,q,:])·V_t[g]‖²,
 * g = h / (Ht / Hkv), same solver, from statistics fed by mf_calib_add_v or
 * mf_calib_add_outputs (calibrate_out.h). Its head error is sqrt(residual / Σ_q ‖O_t[q] −
 * mean_q O_t‖²) per sequence: centred, because every mixture of row-stochastic maps
 * reproduces the values' common part for free, so the raw norm would shrink every error
 * by how large the values' mean is, not by how well the head is matched (centred, the
 * error does not change when one vector is added to every value row). The best source
 * layer, the layer error, the prob gate (head error < prob_max_error, layer error ≤
 * max_error), mask_max_error and the IAM-style baseline (cosine of outputs) then use the
 * output numbers; the mask recall rule is unchanged (computed for the fitted W).
 *
 * Memory: Gram statistics are fixed-size; the block masses for the recall are kept per
 * sequence at 8 × 8 blocks (≈ 1/128 of the maps' size each).
 *
 * Ownership: mf_calib_t is opaque, created/destroyed by the caller; results point into
 * it. Thread safety: one thread per mf_calib_t.
 */
#ifndef MF_CALIBRATE_H
#define MF_CALIBRATE_H

#include <stdint.h>

#include "mapflow.pb-c.h"
#include "mf_status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mf_calib mf_calib_t;

/* What W is fitted to (mf_calib_opts_t.objective). */
typedef enum mf_calib_objective {
    MF_CALIB_MAPS = 0,    /* the attention maps (the default) */
    MF_CALIB_OUTPUTS = 1, /* the head outputs A·V with the target's own V */
} mf_calib_objective_t;

typedef struct mf_calib_opts {
    double max_error;        /* layer error above this: no prob head in it (0: 0.9) */
    double prob_max_error;   /* head error below this: prob mode (0: 0.2) */
    double mask_max_error;   /* optional extra gate for mask mode (0: none) */
    double mask_min_recall;  /* mask recall at least this: mask mode (0: 0.9) */
    double mask_top_p;       /* source rows' Top-P; target Top-P of mask heads (0: 0.95) */
    int per_head_top_p;      /* nonzero: per mask head the smallest grid Top-P reaching
                                mask_min_recall */
    uint32_t min_l0;         /* layers below are never mapped */
    uint32_t block_size;     /* profile block size, power of two ≥ 8 (0: 64) */
    uint32_t recompute_last, recompute_first;
    const char *source_model, *target_model;
    uint32_t max_iters;      /* projected-gradient iterations per fit (0: 5000) */
    int objective;           /* mf_calib_objective_t (0: MF_CALIB_MAPS) */
} mf_calib_opts_t;

/* One target layer's result; arrays are [Ht × Hs] and [Ht]. The errors (error,
 * head_error, source_errors, base_*) are those of the last fit's objective: relative map
 * errors, or centred relative output errors under MF_CALIB_OUTPUTS. */
typedef struct mf_calib_layer {
    uint32_t target_layer, source_layer;
    double error;            /* fitted layer error against source_layer */
    const double *w;
    const double *head_error;
    const uint8_t *mode;     /* mf_head_mode_t */
    const double *recall;    /* [Ht] mask recall at top_p */
    const double *top_p;     /* [Ht] target Top-P (mask heads: the chosen one; others:
                                the largest tried) */
    const double *source_errors; /* [Ls] the fitted layer error for every source layer */
    double base_error;       /* IAM-style baseline, same source layer */
    const double *base_w;
    const double *base_head_error;
    const uint8_t *base_mode;
    const double *base_recall;
    const double *base_top_p;
} mf_calib_layer_t;

mf_status_t mf_calib_create(uint32_t src_layers, uint32_t src_heads, uint32_t tgt_layers,
                            uint32_t tgt_heads, mf_calib_t **out);
void mf_calib_destroy(mf_calib_t *c);

/* Adds one sequence: src [Ls, Hs, N, N], tgt [Lt, Ht, N, N] (row = query, col = key;
 * entries above the diagonal are ignored). */
mf_status_t mf_calib_add(mf_calib_t *c, const float *src, const float *tgt, uint32_t n);

/*
 * The OUTPUTS objective's feed (both optional; MF_CALIB_MAPS needs neither). Every
 * (target, source) layer pair must have received as many sequences as mf_calib_add did
 * before an OUTPUTS fit (else MF_FAILED_PRECONDITION); kv_heads must divide Ht, head_dim
 * ≤ 1024, and both stay the same across calls (else MF_INVALID_ARGUMENT).
 *
 * mf_calib_add_v: one sequence's maps (as mf_calib_add, which it calls) and the target's
 * values v [Lt, kv_heads, N, head_dim]; the products A·V are computed here (N²·d per
 * source head, target layer and kv head: fine for tests and the CLI, slow at 2k tokens).
 *
 * mf_calib_add_outputs: the products given by the caller (e.g. on a GPU), for one
 * sequence of one pair (t, l), after mf_calib_add of that sequence: o_src [kv_heads, Hs,
 * N, head_dim] = A_l[s]·V_t[g] (causal), o_tgt [Ht, N, head_dim] = the target's head outputs.
 */
mf_status_t mf_calib_add_v(mf_calib_t *c, const float *src, const float *tgt, const float *v,
                           uint32_t n, uint32_t kv_heads, uint32_t head_dim);
mf_status_t mf_calib_add_outputs(mf_calib_t *c, uint32_t target_layer, uint32_t source_layer,
                                 const float *o_src, const float *o_tgt, uint32_t n,
                                 uint32_t kv_heads, uint32_t head_dim);

/* Fits every target layer; afterwards mf_calib_l0 / mf_calib_layer read the result. */
mf_status_t mf_calib_fit(mf_calib_t *c, const mf_calib_opts_t *opts);
uint32_t mf_calib_l0(const mf_calib_t *c);
mf_status_t mf_calib_layer(const mf_calib_t *c, uint32_t target_layer, mf_calib_layer_t *out);

/*
 * The fitted (baseline = 0) or IAM-style (baseline = 1) profile: layers ≥ L0, freed with
 * mf_profile_free.
 */
mf_status_t mf_calib_profile(const mf_calib_t *c, const mf_calib_opts_t *opts, int baseline,
                             Mapflow__V1__MappingProfile **out);

/* Projects v[n] onto the probability simplex in place (exposed for tests). */
void mf_simplex_project(double *v, uint32_t n);

#ifdef __cplusplus
}
#endif
#endif /* MF_CALIBRATE_H */
