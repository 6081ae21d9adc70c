/*
 * bench_rows — the benchmark's workload: a context of seeded tokens with its prefix hashes
 * (mf_hash_prefix) and real map rows built with the proto builder (mf_row_init, codec
 * tiles from mf_tile_encode, mf_row_seal — mf_row_build with the FP8 tiles encoded once
 * into a small pool instead of per entry) at production shape
 * (B = 64, 32 source heads; each head keeps the sink block, the diagonal block and
 * random other key blocks up to `density` of the blocks j ≤ i; codec FP8_E4M3 with
 * random tiles, or MASK).
 *
 * Ownership: mfb_context_init / mfb_row_make allocate; the matching _free releases.
 * Rows are 16-byte aligned (the decoder and the arena want it).
 * Thread safety: pure on caller memory except the shared encoded tile pool, which is
 * built on the first FP8 mfb_row_make call — make it before starting threads.
 */
#ifndef BENCH_ROWS_H
#define BENCH_ROWS_H

#include <stddef.h>
#include <stdint.h>

#include "mf_hash.h"
#include "mf_row.h"

typedef struct mfb_context {
    char ns[129];
    char model[256];
    uint32_t block_size;
    uint32_t *tokens;
    size_t n_tokens;
    mf_hash128_t *hashes; /* one per full block */
    size_t n_blocks;
} mfb_context_t;

typedef struct mfb_row {
    uint8_t *data;
    size_t len;
    uint32_t layer, block;
    mf_hash128_t hash;
    uint32_t n_entries;
} mfb_row_t;

typedef struct mfb_row_shape {
    uint32_t n_heads;  /* 32 */
    double density;    /* 0.10: fraction of (head, key block ≤ i) pairs kept */
    mf_codec_t codec;  /* MF_CODEC_FP8_E4M3 or MF_CODEC_MASK */
    uint64_t seed;
} mfb_row_shape_t;

/* Tokens (ids < 151936) seeded by seed; hashes under (ns, model, block_size). */
mf_status_t mfb_context_init(mfb_context_t *cx, const char *ns, const char *model,
                             uint32_t block_size, size_t n_tokens, uint64_t seed);
void mfb_context_free(mfb_context_t *cx);

/* Row of query block `block` of `layer`. *why says what failed. */
mf_status_t mfb_row_make(const mfb_context_t *cx, uint32_t layer, uint32_t block,
                         const mfb_row_shape_t *shape, mfb_row_t *out, const char **why);
void mfb_row_free(mfb_row_t *r);

/* The whole workload of one run: one context, stored twice under two models —
 * MASK rows of every block × mask_layers (lookups and prefix gets walk them), and FP8
 * rows of fp8_rows blocks spread evenly over [fp8_first_block, last block] ×
 * fp8_layers (the ≥ 1 MiB rows of a 6k–32k context; puts and gets move them). */
typedef struct mfb_workload_params {
    size_t ctx_tokens;        /* 32768 = 512 blocks of 64 */
    uint32_t mask_layers;     /* 16 */
    uint32_t fp8_rows;        /* blocks per layer */
    uint32_t fp8_layers;
    uint32_t fp8_first_block; /* 95: the first block whose FP8 row is ≥ 1 MiB */
    uint64_t seed;
} mfb_workload_params_t;

typedef struct mfb_workload {
    mfb_context_t mask_cx, fp8_cx;
    mfb_row_t *mask;          /* layer-major: mask[l * n_blocks + i] */
    size_t n_mask;
    uint32_t mask_layers;
    mfb_row_t *fp8;           /* layer-major too */
    size_t n_fp8;
    size_t fp8_max_len, fp8_min_len;
    uint64_t fp8_bytes, mask_bytes;
} mfb_workload_t;

#define MFB_NS "bench"
#define MFB_BLOCK 64
#define MFB_HEADS 32

mf_status_t mfb_workload_build(mfb_workload_t *w, const mfb_workload_params_t *p,
                               const char **why);
void mfb_workload_free(mfb_workload_t *w);

#endif /* BENCH_ROWS_H */
