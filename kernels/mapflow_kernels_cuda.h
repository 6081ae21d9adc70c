/*
 * mapflow_kernels_cuda — the CUDA versions of mf_extract_ref / mf_apply_ref
 * (mapflow_kernels.h is the specification; DESIGN §2, §5, §9). Same semantics, plus a
 * cudaStream_t; every launcher returns an mf_status_t for what it can check on the host
 * (shapes, supported sizes, launch errors). Work is queued on the stream: outputs are
 * valid once the stream has reached that point.
 *
 * Supported here (else MF_UNIMPLEMENTED): B ∈ {32, 64, 128}, d ∈ {64, 128}, Q/K/V in
 * F16 or BF16, ceil(N / B) ≤ MF_CUDA_MAX_BLOCKS. Tensors are device pointers in the
 * layouts of mapflow_kernels.h ([N, H, d] row-major, O float32; mf_apply_cuda and
 * mf_export_cuda can also store O in the inputs' dtype: o_dtype).
 *
 * Ownership: device buffers are the caller's. Host arrays named below (row pointer tables,
 * caps, the layer map, tokens, exact flags) are read during the call only: the launcher
 * copies them into scratch before it returns, so they may be freed at once. That scratch is
 * cached per device and per launcher (mf_apply_cuda; mf_extract_cuda and mf_export_cuda's
 * rows; mf_rows_copy_cuda), grown on demand and kept until the process ends (apply: about
 * Ht·ceil(N/B)²/8 bytes of bitmaps plus the constants, 4 MiB at N = 64k, Ht = 32, B = 64;
 * extract: nq·i1·12 bytes of head masks and offsets plus the constants, 3 MiB at N = 32k,
 * B = 64, plus the masses and LSE when extract computes them), with a small ring of pinned
 * staging buffers for the constants (kernels/dev_cache.cuh). Bench switches MF_APPLY_CACHE=0 and
 * MF_EXTRACT_CACHE=0 allocate per call (stream-ordered) and copy the constants from
 * pageable memory, as before the caches; other values are MF_INVALID_ARGUMENT.
 * Thread safety: any thread may call. Global state: a once-initialised constant (the xxh3
 * secret), per-kernel "shared-memory limit raised" flags, per-thread tensor-map caches, and
 * the launchers' per-device scratch, each under a mutex held for the host part of a call
 * (µs); calls of one launcher on different streams of one device are ordered on the device
 * (each waits for the previous call's launches); calls of different launchers may overlap.
 */
#ifndef MAPFLOW_KERNELS_CUDA_H
#define MAPFLOW_KERNELS_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "mapflow_kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Only the type, so C callers need no CUDA headers. */
typedef struct CUstream_st *mf_cuda_stream_t;

#define MF_CUDA_MAX_BLOCKS 2048u

/* MF_OK when (B, d, dtype, N) is supported by the CUDA kernels; *why otherwise. */
mf_status_t mf_cuda_supported(uint32_t block_size, uint32_t head_dim, mf_dtype_t dtype,
                              uint32_t n_tokens, const char **why);

typedef struct mf_extract_cuda_args {
    mf_qkv_t src;            /* device Q, K (V unused), F16 or BF16 */
    const float *lse;        /* device [Hq, N] natural-log row LSE, or NULL: computed here */
    uint32_t block_size;
    float top_p;
    mf_codec_t codec;
    uint32_t i0, i1;         /* query blocks [i0, i1), full blocks only */
    const char *model;       /* host */
    const char *ns;          /* host */
    uint32_t layer;
    const uint32_t *tokens;  /* HOST [N]: the prefix hashes are computed on the host */
    void *const *rows;       /* HOST array [i1 − i0] of DEVICE row buffers, 16-byte aligned */
    const size_t *caps;      /* HOST [i1 − i0] capacities (mf_extract_row_bound never fails) */
    uint64_t *sizes;         /* DEVICE out [i1 − i0]: row bytes (needed, when too small) */
    uint32_t *failed_block;  /* DEVICE out: UINT32_MAX, or the lowest block that did not fit
                              * (rows that do not fit are left unwritten) */
    float *mass_out;         /* DEVICE out, optional: [Hq][i1 − i0][i1] block masses (fp32),
                              * 0 above the diagonal; for checks */
    uint32_t fields;         /* options, as mf_extract_args_t's (MF_EXTRACT_*) */
    uint32_t sample_stride;  /* MF_EXTRACT_SAMPLE: only the sampled rows' scores are computed
                              * (one CTA per `stride` query blocks gathers their B sampled rows) */
    uint32_t sample_offset;
} mf_extract_cuda_args_t;

/*
 * Source side (mf_extract_ref): block masses from Q, K and the row LSE, Top-P per (head,
 * query block), union over heads, tiles encoded straight into the row buffers, xxh3
 * checksum sealed on the device. Never forms the dense N×N map: scratch is O(Hq·nb²)
 * masses plus O(nb²) head masks. With MF_EXTRACT_SAMPLE the mass pass reads only the
 * sampled rows (and, with lse given, nothing else of the N² scores for a mask codec).
 */
mf_status_t mf_extract_cuda(const mf_extract_cuda_args_t *a, mf_cuda_stream_t stream,
                            const char **why);

typedef struct mf_export_cuda_args {
    mf_extract_cuda_args_t ex; /* as for mf_extract_cuda, with ex.src.v set (the layer's V),
                                * block_size 64, and ex.lse, ex.mass_out NULL; its masses
                                * are exact, so a sample stride other than 1 is refused */
    void *o;                 /* DEVICE out [N, Hq, d]: the layer's attention output, as o_dtype */
    float *lse;              /* DEVICE out [Hq, N], optional: the row LSE (natural log) */
    float *mass;             /* DEVICE out [Hq][N/64][N/64], optional: the block masses the
                              * rows were selected from (mf_attention_masses_cuda's layout) */
    void *scratch;           /* DEVICE, optional: the forward's ℓ scratch, as
                              * mf_attention_masses_cuda's (≥ mf_attention_masses_scratch(N)
                              * bytes, 256-byte aligned, not shared with a concurrent call) */
    size_t scratch_bytes;
    mf_dtype_t o_dtype;      /* O's element type: MF_DTYPE_F32 (0, the default) or ex.src.dtype
                              * (O rounded once from the fp32 accumulators: the model's own
                              * dtype, so the source needs no fp32 O and no cast) */
    mf_cuda_stream_t rows_stream; /* optional: the rows' launches (selection … seal, and
                              * the writes of ex.sizes / ex.failed_block) go to this stream,
                              * after the forward (an event), so `stream` goes on with O at
                              * once; NULL: all on `stream`. LSE, masses and the row
                              * buffers are then in use until rows_stream passes the call */
} mf_export_cuda_args_t;

/*
 * The source's exporter: the layer's dense causal attention and its rows in one call. The
 * fused forward (mf_attention_masses_cuda: O, LSE and the exact B = 64 block masses in one
 * pass over the keys) replaces extract's own LSE and mass passes; selection, union,
 * encoding (prob tiles recomputed on the kept blocks only) and the seal are then
 * mf_extract_cuda's, on those masses, for query blocks [ex.i0, ex.i1). Rows equal
 * mf_extract_ref's up to the masses' fp32 rounding. What the caller does not pass (LSE,
 * masses, the forward's ℓ scratch) is allocated stream-ordered for the call; a source on
 * its hot path passes all three (the stream-ordered pool may give memory back at every
 * synchronisation). MF_UNIMPLEMENTED where
 * mf_attention_masses_cuda is (off sm_90, B ≠ 64); MF_INVALID_ARGUMENT for bad arguments
 * as mf_extract_cuda, ex.lse / ex.mass_out set, or an o_dtype other than F32 and
 * ex.src.dtype.
 */
mf_status_t mf_export_cuda(const mf_export_cuda_args_t *a, mf_cuda_stream_t stream,
                           const char **why);

/*
 * mf_rows_copy_ref on the device, in one launch: for x in [0, n), sizes[x] bytes from
 * src[x] to dst[x], device to device (both DEVICE addresses of the current device, or
 * mapped through CUDA IPC). The source's put path: a layer's rows from the exporter's
 * buffer into their places in a put region, on the put thread's own stream. dst, src and
 * sizes are HOST arrays, read during the call only; the checks are mf_rows_copy_check's
 * (MF_INVALID_ARGUMENT, nothing queued). 16-byte copies where both addresses of a row are
 * 16-byte aligned (rows are), bytes otherwise.
 */
mf_status_t mf_rows_copy_cuda(void *const *dst, const void *const *src, const size_t *sizes,
                              uint32_t n, mf_cuda_stream_t stream, const char **why);

typedef struct mf_apply_cuda_args {
    const void *const *rows; /* HOST array [n_rows] of DEVICE row pointers (query block i
                              * or NULL); the rows are read in place (they may live in
                              * another process's arena opened through CUDA IPC) */
    uint32_t n_rows;
    const mf_layer_map_t *map; /* host arrays */
    mf_qkv_t tgt;            /* device target Q, K, V; Hq = Ht */
    uint32_t block_size;
    const uint8_t *exact;    /* host [ceil(N/B)] or NULL */
    uint32_t exact_first, exact_last;
    void *o;                 /* device out [N, Ht, d], as o_dtype (float32 by default) */
    uint32_t *bad_rows;      /* device, optional: incremented once for each (row, target
                              * head reading it) whose header disagrees (block index, B,
                              * heads, codec): one bad row read by h heads adds h; that
                              * block is then computed exactly instead */
    mf_dtype_t o_dtype;      /* O's element type: MF_DTYPE_F32 (0, the default) or tgt.dtype
                              * (every path's O rounded once to nearest from its fp32 value:
                              * the model's own dtype, no fp32 O to write and cast; last in
                              * the struct so that initialisers of before still compile) */
} mf_apply_cuda_args_t;

/*
 * Target side (mf_apply_ref): each (query block, target head) runs
 * its head's mode — prob (tiles mixed with W on chip, × V, renormalised), mask (mixed
 * masses → Top-P → attention over the kept blocks with the target's Q, K, V) or compute
 * (dense causal, our own tensor-core kernel; no cuDNN / cuBLAS) — reading each row's
 * union columns once. v2 is one launch per layer; on sm_90 mask / compute heads run on the
 * attention core instead (see mf_apply_impl_t): a pre-pass launch, the core, and v2 for
 * prob heads when there are any (a layer of prob heads only, with no exact block, is v2's
 * alone). MF_INVALID_ARGUMENT (nothing queued) for an o_dtype other than F32 and
 * tgt.dtype, as mf_export_cuda's.
 */
mf_status_t mf_apply_cuda(const mf_apply_cuda_args_t *a, mf_cuda_stream_t stream,
                          const char **why);

/*
 * Dense causal attention (mf_attention_dense_ref) on the sm_90a attention core
 * (kernels/attn_core.cu: wgmma, TMA, warp-specialised): o [N, Hq, d] float32 and, if lse
 * != NULL, LSE [Hq, N] (natural log of the scaled scores), both device buffers. Q/K/V F16
 * or BF16, d ∈ {64, 128}, N ≤ 2048 · 128, base pointers 16-byte aligned. MF_UNIMPLEMENTED
 * (with *why) off an sm_90 device or for other shapes.
 */
mf_status_t mf_attention_dense_cuda(const mf_qkv_t *t, float *o, float *lse,
                                    mf_cuda_stream_t stream, const char **why);

/*
 * mf_attention_dense_cuda that also returns the exact block masses of B = 64 blocks, as
 * mf_extract_ref defines them (mass[h][i][j] = mean over the rows r of block i of
 * Σ_{k in block j, k ≤ r} exp(s[r][k] − LSE[r])), from the same pass: the online softmax's
 * per-64-key row sums are kept as block-local log-sum-exps in an L2-sized scratch and
 * reduced against the final LSE at the end of each query tile. mass: device
 * [Hq][N/64][N/64] fp32 (mf_extract_cuda's mass_out layout with i0 = 0, i1 = N/64), 0 above
 * the diagonal; a partial last block has no mass row. lse may be NULL. scratch: device,
 * 256-byte aligned, ≥ mf_attention_masses_scratch(N) bytes, not used by another call at
 * the same time; NULL allocates it on the stream (cudaMallocAsync) for this call.
 * MF_UNIMPLEMENTED for B ≠ 64 and where mf_attention_dense_cuda is.
 */
mf_status_t mf_attention_masses_cuda(const mf_qkv_t *t, uint32_t block_size, float *o,
                                     float *lse, float *mass, void *scratch,
                                     size_t scratch_bytes, mf_cuda_stream_t stream,
                                     const char **why);

/* Scratch bytes mf_attention_masses_cuda needs at N tokens on the current device (0 when
 * the device cannot be queried or N = 0). */
size_t mf_attention_masses_scratch(uint32_t n_tokens);

/*
 * Which apply kernel runs. core: on an sm_90 device at B ∈ {64, 128} (else as v2), mask and
 * compute heads and every exact block run on the sm_90a attention core (a pre-pass kernel
 * mixes the masses, selects Top-P and writes per-(head, query block) block bitmaps; the
 * core pairs adjacent 64-row query blocks into 128-row tiles); prob heads at B = 64 on the
 * core's prob kernel (V and the source tiles staged by TMA / bulk copies, the W-mixed tile
 * the A operand of wgmma; v2 computes the rows whose kept mass is 0), at B = 128 on v2.
 * v2: one CTA per (query block, target head), every mode; it stays for prob heads at
 * B = 128, those rows, and as the whole apply off sm_90. Both compute the same function
 * (gpu_check runs each). Rows must be 16-byte aligned (a row that is not counts as bad). v3 (GQA-packed, slower than v2) was removed: MF_APPLY_IMPL_V3
 * returns MF_INVALID_ARGUMENT (bench/gpu/NOTES.md keeps its numbers).
 * DEFAULT: the environment's MF_APPLY_IMPL (core | v2) when set, else
 * MF_APPLY_IMPL_BUILTIN.
 * Bench-only switches (bench/gpu/core_bench.py; read per call, not a product interface):
 * MF_APPLY_PHASE = prepass | core | none queues only the core's pre-pass, only the core (on
 * the bitmaps the previous call left in the cached scratch: O is right only when that call
 * had the same inputs), or no kernel (host work and the constants copy alone), never v2;
 * MF_APPLY_ONLY = prob | mask | compute runs only the heads of that mode (the others' O is
 * not written); MF_APPLY_CACHE = 0 allocates the scratch per call and copies the constants
 * from pageable memory, as before the cache; MF_APPLY_PREPASS = v1 runs the pre-pass of
 * before (full-size shared memory, blocks ascending, its ordered loop over every column).
 * Same outputs bit for bit under every switch. MF_APPLY_PROB = v2 runs prob heads on v2
 * under core as before the core's prob kernel (an A/B; outputs within rounding, not bit
 * for bit). Any other value: MF_INVALID_ARGUMENT.
 */
typedef enum mf_apply_impl {
    MF_APPLY_IMPL_DEFAULT = 0,
    MF_APPLY_IMPL_V2 = 2,
    MF_APPLY_IMPL_V3 = 3, /* removed; reserved: MF_INVALID_ARGUMENT */
    MF_APPLY_IMPL_CORE = 4,
} mf_apply_impl_t;
#define MF_APPLY_IMPL_BUILTIN MF_APPLY_IMPL_CORE

/* mf_apply_cuda with an explicit implementation (mf_apply_cuda = DEFAULT). */
mf_status_t mf_apply_cuda_impl(const mf_apply_cuda_args_t *a, mf_apply_impl_t impl,
                               mf_cuda_stream_t stream, const char **why);

#ifdef __cplusplus
}
#endif
#endif /* MAPFLOW_KERNELS_CUDA_H */
