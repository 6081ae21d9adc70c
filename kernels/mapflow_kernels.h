/*
 * mapflow_kernels — the C reference of MapFlow's kernels (DESIGN §2, §5, §9): extract
 * (source side: Q, K → block masses → Top-P → map rows), apply (target side: rows +
 * mapping → attention output, per-head prob / mask / compute) and the float64 helpers
 * they are defined by (dense causal attention, Top-P block selection).
 *
 * These functions are the specification. The CUDA kernels (kernels/<name>.cu) take the same
 * arguments plus a cudaStream_t and are compared with them on random inputs. Tensors are
 * plain pointers + dims + a dtype, row-major:
 *   Q [N, Hq, d], K [N, Hkv, d], V [N, Hkv, d], O [N, Hq, d], LSE [Hq, N].
 * GQA: query head h reads KV head h / (Hq / Hkv); Hq must be a multiple of Hkv.
 * Scale is 1/sqrt(d) everywhere; attention is causal (key k ≤ query r).
 *
 * Ownership: every buffer belongs to the caller; nothing here keeps a pointer after it
 * returns. Scratch memory is malloc'd and freed inside each call (MF_RESOURCE_EXHAUSTED
 * when that fails). Thread safety: no global state; any thread, concurrent calls fine.
 */
#ifndef MAPFLOW_KERNELS_H
#define MAPFLOW_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "mf_hash.h"
#include "mf_row.h"
#include "mf_status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum mf_dtype {
    MF_DTYPE_F32 = 0,
    MF_DTYPE_F16 = 1,
    MF_DTYPE_BF16 = 2,
} mf_dtype_t;

/* Per-head reuse mode; the numbers are proto HeadMode's. */
typedef enum mf_head_mode {
    MF_HEAD_COMPUTE = 0,   /* the target computes the head itself (dense causal) */
    MF_HEAD_PROB = 1,      /* O = Σ_s W[t,s]·P_s·V over the row's columns, renormalised */
    MF_HEAD_MASK = 2,      /* mixed masses → target Top-P → exact attention on kept blocks */
} mf_head_mode_t;

/* Bounds every entry point checks before it allocates anything. */
#define MF_KERNELS_MAX_TOKENS (1u << 20)
#define MF_KERNELS_MAX_DIM    1024u

/* One attention layer's inputs (V unused by extract). */
typedef struct mf_qkv {
    const void *q;         /* [N, Hq, d] */
    const void *k;         /* [N, Hkv, d] */
    const void *v;         /* [N, Hkv, d]; may be NULL where not needed */
    mf_dtype_t dtype;
    uint32_t n_tokens;     /* N */
    uint32_t n_q_heads;    /* Hq, 1..64 */
    uint32_t n_kv_heads;   /* Hkv, divides Hq */
    uint32_t head_dim;     /* d, 1..1024 */
} mf_qkv_t;

/* ---- float64 reference helpers (the demo and the quality eval compare with these) ---- */

/* Element idx of a tensor of this dtype, as float. */
float mf_tensor_get(const void *t, mf_dtype_t dtype, size_t idx);
/* Converts n elements to float32 (dst may not alias src). */
void mf_tensor_to_f32(const void *src, mf_dtype_t dtype, size_t n, float *dst);

/* Checks shapes and bounds of a mf_qkv_t (need_v: V must be present). */
mf_status_t mf_qkv_check(const mf_qkv_t *t, int need_v, const char **why);

/*
 * Softmax probabilities of query row `row`, head `head`: p[0..row] (causal), computed in
 * double; also its natural-log LSE of the scaled scores if lse != NULL.
 */
mf_status_t mf_attention_row_ref(const mf_qkv_t *t, uint32_t head, uint32_t row, double *p,
                                 double *lse);

/*
 * Dense causal attention in float64: o [N, Hq, d] and, if lse != NULL, LSE [Hq, N]
 * (natural log). Needs V.
 */
mf_status_t mf_attention_dense_ref(const mf_qkv_t *t, double *o, double *lse);

/*
 * Top-P block selection for query block i = n_blocks − 1 (DESIGN §5). Candidates are the
 * blocks j < n_blocks with cand[j] != 0 (cand NULL = all). Blocks 0 and i are always
 * kept; then the other candidates are added largest mass first (ties to lower j) until
 * the kept mass ≥ top_p × (total candidate mass). top_p ≥ 1 keeps every candidate.
 * This is the smallest set that contains {0, i} and reaches the target. keep[j] is set
 * to 1 or 0 for every j; *n_kept receives the count.
 */
mf_status_t mf_topp_select(const double *mass, const uint8_t *cand, uint32_t n_blocks,
                           double top_p, uint8_t *keep, uint32_t *n_kept);

/* ---- extract (source side) ------------------------------------------------------------ */

typedef struct mf_extract_args {
    mf_qkv_t src;          /* source Q, K (V unused); Hq = the row's n_heads ≤ 64 */
    const float *lse;      /* [Hq, N] natural-log row LSE, or NULL to compute it */
    uint32_t block_size;   /* B: power of two in [8, 256] */
    float top_p;           /* (0, 1] */
    mf_codec_t codec;
    uint32_t i0, i1;       /* query blocks [i0, i1), all full: i1 ≤ N / B */
    const char *model;     /* source model id (1..255 bytes) */
    const char *ns;        /* namespace for the prefix hashes (DESIGN §4) */
    uint32_t layer;
    const uint32_t *tokens; /* [N] the context's tokens (rows carry theirs; hashes) */
    /* Options: `fields` names the ones set (MF_EXTRACT_*), so a zeroed struct keeps the
     * defaults and an older caller's layout stays valid. */
    uint32_t fields;
    uint32_t sample_stride; /* MF_EXTRACT_SAMPLE: masses from query rows r ≡ sample_offset
                             * (mod stride) of each block only; 1 (default) = every row;
                             * a power of two ≤ B (so it divides B) */
    uint32_t sample_offset; /* MF_EXTRACT_SAMPLE: < sample_stride (default 0) */
} mf_extract_args_t;

/* Bits of mf_extract_args_t.fields / mf_extract_cuda_args_t.fields. */
#define MF_EXTRACT_SAMPLE 1u /* sample_stride, sample_offset are set */
#define MF_EXTRACT_FIELDS_ALL MF_EXTRACT_SAMPLE

/*
 * Checks extract's options (fields, stride, offset as in mf_extract_args_t) for block size
 * B and returns the effective sampling: *stride = 1, *offset = 0 unless MF_EXTRACT_SAMPLE
 * is set. MF_INVALID_ARGUMENT with *why for unknown bits or a stride / offset out of range.
 * Shared by mf_extract_ref and mf_extract_cuda so both accept exactly the same options.
 */
mf_status_t mf_extract_options(uint32_t fields, uint32_t sample_stride, uint32_t sample_offset,
                               uint32_t block_size, uint32_t *stride, uint32_t *offset,
                               const char **why);

/*
 * The rows' copy (the spec of mf_rows_copy_cuda, kernels/mapflow_kernels_cuda.h): for x in
 * [0, n), sizes[x] bytes from src[x] to dst[x] (a memcpy loop). Host memory here. Checks
 * (mf_rows_copy_check, shared with the CUDA one): n ≤ MF_ROWS_COPY_MAX, the arrays present
 * when n > 0, each size ≤ MF_ROW_MAX_BYTES, both addresses present when the size is not 0,
 * and a row's source and destination ranges disjoint; MF_INVALID_ARGUMENT with *why
 * otherwise, nothing copied. Ranges of different rows must not overlap either (not
 * checked: O(n log n) for a contract the caller's allocator already gives).
 */
#define MF_ROWS_COPY_MAX (1u << 20)
mf_status_t mf_rows_copy_check(void *const *dst, const void *const *src, const size_t *sizes,
                               uint32_t n, size_t *max_size, const char **why);
mf_status_t mf_rows_copy_ref(void *const *dst, const void *const *src, const size_t *sizes,
                             uint32_t n, const char **why);

/*
 * Upper bound on the bytes of row i (every head keeps every block j ≤ i): a buffer this
 * large never fails with MF_RESOURCE_EXHAUSTED. 0 if the arguments are out of range.
 */
size_t mf_extract_row_bound(mf_codec_t codec, uint32_t block_size, uint32_t n_heads,
                            uint32_t block_index, size_t model_len);

/*
 * Writes query blocks i0..i1−1 as map rows: rows[k] (16-byte aligned, caps[k] bytes)
 * receives row i0 + k; sizes[k] its length. Mass of (h, i, j) = mean over the B query
 * rows of block i of the probability in key block j, accumulated in double; selection by
 * mf_topp_select(); tiles hold P[r][k] (0 above the diagonal). With MF_EXTRACT_SAMPLE
 * (stride s, offset o) the mean runs over the B / s rows r = iB + o + m·s only,
 *   mass[i][j] = (s / B) · Σ_m Σ_{k in block j, k ≤ r} exp(scale·q_r·k_k − LSE[r]),
 * the approximate masses of a source whose attention we do not own: pass the LSE its
 * engine returned (lse), and the work of the mass pass drops by s. If a buffer is too small
 * the call stops with MF_RESOURCE_EXHAUSTED, sizes[k] = bytes needed, *failed_block = i.
 */
mf_status_t mf_extract_ref(const mf_extract_args_t *a, void *const *rows, const size_t *caps,
                           size_t *sizes, uint32_t *failed_block, const char **why);

/* ---- apply (target side) --------------------------------------------------------------- */

/* One target layer's profile entry as plain arrays (see mf_profile.h for the protobuf). */
typedef struct mf_layer_map {
    uint32_t n_target_heads; /* Ht = target Hq */
    uint32_t n_source_heads; /* Hs = the rows' n_heads */
    const float *w;          /* [Ht × Hs], ≥ 0, rows sum to 1 */
    const uint8_t *mode;     /* [Ht] mf_head_mode_t */
    const float *top_p;      /* [Ht] target Top-P for mask heads (NULL: 1.0) */
} mf_layer_map_t;

typedef struct mf_apply_args {
    const mf_row_view_t *const *rows; /* rows[i] = query block i or NULL; i < n_rows */
    uint32_t n_rows;
    const mf_layer_map_t *map;
    mf_qkv_t tgt;          /* target Q, K, V; Hq = Ht */
    uint32_t block_size;   /* B, equal to every row's */
    const uint8_t *exact;  /* [ceil(N/B)] nonzero = compute block exactly; may be NULL */
    uint32_t exact_first;  /* also exact: the first F query blocks ... */
    uint32_t exact_last;   /* ... and the last R full query blocks (RecomputePolicy) */
    uint32_t q0, q1;       /* query blocks to compute, [q0, q1); q1 = 0: all (a prefill
                              chunk computes only its own rows; O elsewhere untouched) */
    float *o;              /* out [N, Ht, d] float32 */
} mf_apply_args_t;

/* Counters a caller may want (density of the work done), all optional. */
typedef struct mf_apply_stats {
    uint64_t exact_blocks;   /* (head, query block) pairs computed densely */
    uint64_t prob_tiles;     /* (head, key block) tiles read in prob mode */
    uint64_t mask_blocks;    /* (head, key block) blocks attended in mask mode */
    uint64_t mask_candidates; /* (head, key block) pairs j ≤ i on mask heads (denominator) */
} mf_apply_stats_t;

/*
 * Target-side attention for one layer, per head t:
 *  - compute: dense causal attention (target Q, K, V);
 *  - prob: for each query row r of a block with a row, over the row's union columns j,
 *      O[r] = Σ_j Σ_k m[r,k]·V[jB+k] / Σ_j Σ_k m[r,k],   m = Σ_s W[t,s]·P̂_s[r,k],
 *    where P̂_s are the decoded tiles (0 where head s did not keep block j, and keys
 *    k > r are skipped). Dividing by the mixed kept mass makes every output row a
 *    convex combination of V rows (dropped blocks and quantisation lose mass; this puts
 *    it back in proportion). A row whose kept mass is 0 falls back to exact attention.
 *  - mask: M[j] = Σ_s W[t,s]·mass_s[j]; mf_topp_select(M, cand = columns kept by some
 *    head s with W[t,s] > 0, top_p[t]); exact softmax attention with the target's Q, K,
 *    V over the kept blocks only.
 * Query blocks with no row, marked exact, in the recompute policy, and the tokens past
 * the last full block are computed densely for every head.
 */
mf_status_t mf_apply_ref(const mf_apply_args_t *a, mf_apply_stats_t *stats,
                         const char **why);

#ifdef __cplusplus
}
#endif
#endif /* MAPFLOW_KERNELS_H */
