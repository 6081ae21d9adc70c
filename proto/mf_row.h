/*
 * mf_row — the map-row format of DESIGN §5: builder, layout, zero-copy decoder and
 * validator. A row is query block i of one layer of one source model for one context.
 *
 * Layout (all integers little-endian; every section starts 16-byte aligned so a GPU
 * reads it in place, with no decode pass):
 *
 *   header      80 bytes, mf_row_header_t below
 *   model       model_len bytes (UTF-8, no terminator)
 *   tokens      B × u32         the block's tokens (verified on every daemon hit)
 *   cols        C × u32         kept key blocks j ≤ i, union over heads, strictly rising
 *   col_off     C × u32         index of column c's first entry (prefix sum of popcounts)
 *   head_mask   C × u64         bit h set = head h keeps block j
 *   mass        E × u8          block mass per entry, mf_mass_encode()
 *   scales      E × f32         tile max per entry (FP8_E4M3 and U8_LOG only)
 *   tiles       E × B×B × elem  probability tiles, [query row][key] (prob codecs only)
 *
 * An "entry" is one (column, present head) pair; entries are ordered by column, then by
 * head ascending, so entry e of column c, head h is col_off[c] + popcount(mask & (2^h−1)).
 * E = n_entries = Σ popcount(head_mask). Every head always keeps the sink block 0 and
 * the diagonal block i. Mass of (h, i, j) = mean over the B query rows of block i of
 * the probability mass that falls in key block j. checksum = XXH3-64 over the whole row
 * with the checksum field taken as zero.
 *
 * Ownership: the builder writes into the caller's buffer; a view points into the
 * buffer it was decoded from and is valid while that buffer is. No allocation anywhere.
 * Thread safety: pure functions on caller memory; any thread.
 */
#ifndef MF_ROW_H
#define MF_ROW_H

#include <stddef.h>
#include <stdint.h>
#include "mf_hash.h"
#include "mf_status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MF_ROW_MAGIC     0x57524d46u /* bytes "FMRW" */
#define MF_ROW_VERSION   1
#define MF_ROW_ALIGN     16
#define MF_ROW_HEADER    80
#define MF_ROW_MAX_HEADS 64
#define MF_ROW_MIN_BLOCK 8
#define MF_ROW_MAX_BLOCK 256
#define MF_ROW_MAX_MODEL 255
#define MF_ROW_MAX_BYTES 0xfffffff0u

typedef enum mf_codec {
    MF_CODEC_MASK = 0,     /* masses only */
    MF_CODEC_FP16 = 1,
    MF_CODEC_BF16 = 2,
    MF_CODEC_FP8_E4M3 = 3, /* per-tile scale */
    MF_CODEC_U8_LOG = 4,   /* per-tile max, 8-bit log domain */
} mf_codec_t;
#define MF_CODEC_COUNT 5

typedef struct mf_row_header {
    uint32_t magic;
    uint16_t version;
    uint8_t codec;
    uint8_t model_len;
    uint64_t checksum;
    uint32_t total_size;
    uint32_t layer;
    uint32_t block_index;
    uint16_t block_size;
    uint16_t n_heads;
    uint32_t n_cols;
    uint32_t n_entries;
    float top_p;
    uint32_t flags;        /* 0 in version 1 */
    uint8_t parent[16];    /* h(i-1), mf_hash_to_le */
    uint8_t hash[16];      /* h(i) */
} mf_row_header_t;

/* Byte offsets of each section from the start of the row. */
typedef struct mf_row_layout {
    size_t model, tokens, cols, col_off, head_mask, mass, scales, tiles, total;
    size_t elem_bytes;     /* bytes per tile element; 0 for MASK */
    size_t tile_bytes;     /* B×B×elem_bytes */
} mf_row_layout_t;

/* What the header says, given by the writer. */
typedef struct mf_row_spec {
    const char *model;     /* NUL-terminated, 1..255 bytes */
    uint32_t layer;
    uint32_t block_index;  /* i */
    uint32_t block_size;   /* B: power of two in [8, 256] */
    uint32_t n_heads;      /* 1..64 */
    mf_codec_t codec;
    float top_p;
    mf_hash128_t parent;
    mf_hash128_t hash;
    const uint32_t *tokens; /* B tokens of block i */
} mf_row_spec_t;

/* Pointers into a row (decoded, or being written). */
typedef struct mf_row_view {
    const uint8_t *base;
    size_t size;
    mf_codec_t codec;
    uint32_t layer, block_index, block_size, n_heads, n_cols, n_entries;
    float top_p;
    const char *model;     /* not NUL-terminated */
    uint32_t model_len;
    mf_hash128_t parent, hash;
    const uint32_t *tokens, *cols, *col_off;
    const uint64_t *head_mask;
    const uint8_t *mass;
    const float *scales;   /* NULL unless FP8_E4M3 / U8_LOG */
    const void *tiles;     /* NULL for MASK */
    size_t tile_bytes;
} mf_row_view_t;

/* Writable pointers returned by mf_row_init, for writers that fill values in place. */
typedef struct mf_row_wview {
    uint8_t *mass;         /* E */
    float *scales;         /* E or NULL */
    void *tiles;           /* E × tile_bytes or NULL */
    size_t tile_bytes;
    uint32_t n_entries;
    size_t size;
} mf_row_wview_t;

const char *mf_codec_name(mf_codec_t c);            /* "mask", "fp16", "bf16", "fp8", "u8log" */
mf_status_t mf_codec_parse(const char *s, mf_codec_t *out);

/* Section offsets for a row of this shape; MF_INVALID_ARGUMENT if out of bounds. */
mf_status_t mf_row_layout(mf_codec_t codec, uint32_t block_size, uint32_t n_heads,
                          uint32_t n_cols, uint32_t n_entries, uint32_t model_len,
                          mf_row_layout_t *out);

/* Bytes a row needs (head_mask gives E). */
mf_status_t mf_row_size(const mf_row_spec_t *spec, uint32_t n_cols,
                        const uint64_t *head_mask, size_t *size);

/*
 * Writes header, model, tokens, cols, col_off and head_mask into buf (16-byte aligned,
 * cap bytes), zeroes the value sections, and returns where the masses, scales and tiles
 * go. Call mf_row_seal() after filling them. Checks the structure as the decoder would
 * (sorted cols ≤ i, sink and diagonal kept by every head, mask bits < heads).
 * MF_RESOURCE_EXHAUSTED if cap is too small (out->size then tells the size needed).
 */
mf_status_t mf_row_init(void *buf, size_t cap, const mf_row_spec_t *spec,
                        uint32_t n_cols, const uint32_t *cols, const uint64_t *head_mask,
                        mf_row_wview_t *out, const char **why);

/* Computes and stores the checksum of a row of len bytes whose header is written
 * (MF_INVALID_ARGUMENT if the header's size is not len). */
mf_status_t mf_row_seal(void *buf, size_t len);

/*
 * One call: init + encode masses (E floats in [0,1]) and tiles (E × B×B floats, NULL
 * for MASK; for the other codecs the per-tile max is computed here) + seal.
 * *size receives the bytes written, or needed on MF_RESOURCE_EXHAUSTED.
 */
mf_status_t mf_row_build(void *buf, size_t cap, const mf_row_spec_t *spec,
                         uint32_t n_cols, const uint32_t *cols, const uint64_t *head_mask,
                         const float *mass, const float *tiles, size_t *size,
                         const char **why);

#define MF_ROW_NO_CHECKSUM 1u /* rows already validated once (e.g. by the daemon) */

/*
 * Validates a row of exactly len bytes and fills a zero-copy view. On failure returns
 * MF_INVALID_ARGUMENT (malformed), MF_UNIMPLEMENTED (unknown version) or MF_DATA_LOSS
 * (checksum) and sets *why (a static string) to what is wrong. Never reads outside
 * [buf, buf+len). buf must be 16-byte aligned.
 */
mf_status_t mf_row_decode(const void *buf, size_t len, unsigned flags,
                          mf_row_view_t *view, const char **why);

/* 1 when b is a block size rows may have: a power of two in [8, 256] (the one rule the
 * builder, the decoder, the daemon and mapflowctl apply). */
int mf_row_block_size_ok(uint32_t b);

/*
 * The header of a row validated in full before (e.g. at commit), read once into a copy
 * (another process may be writing the memory) and checked for what a hit reads: magic,
 * version, total_size == len, the model and the block's tokens inside len. Fills the
 * view's header fields, model and tokens; cols, masks, masses, scales and tiles are NULL.
 * MF_DATA_LOSS and *why when the header is damaged.
 */
mf_status_t mf_row_peek(const void *buf, size_t len, mf_row_view_t *view, const char **why);

/* What a caller asked for, compared by mf_row_match: only the fields whose MF_MATCH_* bit
 * is set. MF_MATCH_TOKENS compares block_size tokens and implies MF_MATCH_BLOCK_SIZE. */
#define MF_MATCH_MODEL      0x01u
#define MF_MATCH_LAYER      0x02u
#define MF_MATCH_BLOCK      0x04u /* block_index */
#define MF_MATCH_BLOCK_SIZE 0x08u
#define MF_MATCH_PARENT     0x10u
#define MF_MATCH_HASH       0x20u
#define MF_MATCH_TOKENS     0x48u /* with MF_MATCH_BLOCK_SIZE */
typedef struct mf_row_want {
    unsigned fields;
    const char *model;       /* model_len bytes, no terminator needed */
    size_t model_len;
    uint32_t layer, block_index, block_size;
    mf_hash128_t parent, hash;
    const uint32_t *tokens;  /* block_size tokens */
} mf_row_want_t;

/* 1 when the row of view v is the one w asks for; else 0, and *why (static) names the
 * first field that differs. The row check of the client's gets and the daemon's hits. */
int mf_row_match(const mf_row_view_t *v, const mf_row_want_t *w, const char **why);

/* Entry index of (column c, head h), or -1 when head h does not keep column c. */
static inline int64_t mf_row_entry(const mf_row_view_t *v, uint32_t c, uint32_t h)
{
    uint64_t m = v->head_mask[c];
    if (!((m >> h) & 1u))
        return -1;
    uint64_t below = h ? (m & ((~0ull) >> (64 - h))) : 0;
    return (int64_t)v->col_off[c] + __builtin_popcountll(below);
}

/* Decoded block mass and tile value (q = query row, k = key within the block). */
float mf_row_mass(const mf_row_view_t *v, uint32_t entry);
float mf_row_tile_value(const mf_row_view_t *v, uint32_t entry, uint32_t q, uint32_t k);

/* Encodes one tile of B×B floats into dst with the row's codec; returns the scale
 * (tile max) stored for FP8_E4M3 / U8_LOG, 0 otherwise. */
float mf_tile_encode(mf_codec_t codec, uint32_t block_size, const float *src, void *dst);
/* Decodes one tile to B×B floats. */
void mf_tile_decode(mf_codec_t codec, uint32_t block_size, const void *src, float scale,
                    float *dst);

#ifdef __cplusplus
}
#endif
#endif /* MF_ROW_H */
