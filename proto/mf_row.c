/* mf_row — map-row layout, builder and validating decoder (see mf_row.h). */
#include "mf_row.h"

#include <math.h>
#include <string.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include <xxhash.h>

#include "mf_codec.h"

_Static_assert(sizeof(mf_row_header_t) == MF_ROW_HEADER, "row header is 80 bytes");
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "rows are read in place as LE");

static const char *const codec_names[MF_CODEC_COUNT] = { "mask", "fp16", "bf16", "fp8", "u8log" };

const char *mf_codec_name(mf_codec_t c)
{
    return (unsigned)c < MF_CODEC_COUNT ? codec_names[c] : "invalid";
}

mf_status_t mf_codec_parse(const char *s, mf_codec_t *out)
{
    if (!s || !out)
        return MF_INVALID_ARGUMENT;
    for (int c = 0; c < MF_CODEC_COUNT; c++)
        if (strcmp(s, codec_names[c]) == 0) {
            *out = (mf_codec_t)c;
            return MF_OK;
        }
    if (strcmp(s, "fp8_e4m3") == 0) {
        *out = MF_CODEC_FP8_E4M3;
        return MF_OK;
    }
    if (strcmp(s, "u8_log") == 0) {
        *out = MF_CODEC_U8_LOG;
        return MF_OK;
    }
    return MF_INVALID_ARGUMENT;
}

static size_t align16(size_t x)
{
    return (x + (MF_ROW_ALIGN - 1)) & ~(size_t)(MF_ROW_ALIGN - 1);
}

static size_t codec_elem_bytes(mf_codec_t c)
{
    switch (c) {
    case MF_CODEC_FP16:
    case MF_CODEC_BF16:
        return 2;
    case MF_CODEC_FP8_E4M3:
    case MF_CODEC_U8_LOG:
        return 1;
    default:
        return 0;
    }
}

static int codec_has_scales(mf_codec_t c)
{
    return c == MF_CODEC_FP8_E4M3 || c == MF_CODEC_U8_LOG;
}

int mf_row_block_size_ok(uint32_t b)
{
    return b >= MF_ROW_MIN_BLOCK && b <= MF_ROW_MAX_BLOCK && (b & (b - 1)) == 0;
}

mf_status_t mf_row_layout(mf_codec_t codec, uint32_t block_size, uint32_t n_heads,
                          uint32_t n_cols, uint32_t n_entries, uint32_t model_len,
                          mf_row_layout_t *o)
{
    if (!o || (unsigned)codec >= MF_CODEC_COUNT || !mf_row_block_size_ok(block_size) ||
        n_heads < 1 || n_heads > MF_ROW_MAX_HEADS || model_len < 1 ||
        model_len > MF_ROW_MAX_MODEL || n_cols < 1 ||
        (uint64_t)n_entries > (uint64_t)n_cols * n_heads)
        return MF_INVALID_ARGUMENT;
    /* All arithmetic in 64 bits: n_cols ≤ 2^32 and E ≤ 2^38 cannot overflow here. */
    uint64_t off = MF_ROW_HEADER;
    o->model = (size_t)off;
    off = align16(off + model_len);
    o->tokens = (size_t)off;
    off = align16(off + 4ull * block_size);
    o->cols = (size_t)off;
    off = align16(off + 4ull * n_cols);
    o->col_off = (size_t)off;
    off = align16(off + 4ull * n_cols);
    o->head_mask = (size_t)off;
    off = align16(off + 8ull * n_cols);
    o->mass = (size_t)off;
    off = align16(off + (uint64_t)n_entries);
    o->scales = (size_t)off;
    if (codec_has_scales(codec))
        off = align16(off + 4ull * n_entries);
    o->elem_bytes = codec_elem_bytes(codec);
    o->tile_bytes = (size_t)block_size * block_size * o->elem_bytes;
    o->tiles = (size_t)off;
    off += (uint64_t)n_entries * o->tile_bytes;
    if (off > MF_ROW_MAX_BYTES)
        return MF_INVALID_ARGUMENT;
    o->total = (size_t)off;
    return MF_OK;
}

static uint32_t count_entries(uint32_t n_cols, const uint64_t *mask)
{
    uint64_t e = 0;
    for (uint32_t c = 0; c < n_cols; c++)
        e += (uint64_t)__builtin_popcountll(mask[c]);
    return (uint32_t)e;
}

/* Shared by the builder and the decoder: the structural rules of DESIGN §5. */
static mf_status_t check_columns(uint32_t block_index, uint32_t n_heads, uint32_t n_cols,
                                 const uint32_t *cols, const uint64_t *mask,
                                 const char **why)
{
    uint64_t all = n_heads == 64 ? ~0ull : ((1ull << n_heads) - 1);
    if (n_cols < 1 || (uint64_t)n_cols > (uint64_t)block_index + 1) {
        *why = "column count out of range (must be 1..i+1)";
        return MF_INVALID_ARGUMENT;
    }
    for (uint32_t c = 0; c < n_cols; c++) {
        if (cols[c] > block_index) {
            *why = "column j > i (key block after the query block)";
            return MF_INVALID_ARGUMENT;
        }
        if (c > 0 && cols[c] <= cols[c - 1]) {
            *why = "columns unsorted or duplicated";
            return MF_INVALID_ARGUMENT;
        }
        if (mask[c] & ~all) {
            *why = "head bitmask has a bit >= n_heads";
            return MF_INVALID_ARGUMENT;
        }
        if (mask[c] == 0) {
            *why = "column kept by no head";
            return MF_INVALID_ARGUMENT;
        }
    }
    if (cols[0] != 0 || mask[0] != all) {
        *why = "sink block 0 not kept by every head";
        return MF_INVALID_ARGUMENT;
    }
    if (cols[n_cols - 1] != block_index || mask[n_cols - 1] != all) {
        *why = "diagonal block i not kept by every head";
        return MF_INVALID_ARGUMENT;
    }
    return MF_OK;
}

static uint64_t row_checksum(const uint8_t *p, size_t len)
{
    static const uint8_t zero[8] = { 0 };
    XXH3_state_t st;
    XXH3_64bits_reset(&st);
    XXH3_64bits_update(&st, p, 8);
    XXH3_64bits_update(&st, zero, 8);
    XXH3_64bits_update(&st, p + 16, len - 16);
    return XXH3_64bits_digest(&st);
}

mf_status_t mf_row_size(const mf_row_spec_t *spec, uint32_t n_cols,
                        const uint64_t *head_mask, size_t *size)
{
    mf_row_layout_t l;
    if (!spec || !spec->model || !head_mask || !size)
        return MF_INVALID_ARGUMENT;
    mf_status_t st = mf_row_layout(spec->codec, spec->block_size, spec->n_heads, n_cols,
                                   count_entries(n_cols, head_mask),
                                   (uint32_t)strlen(spec->model), &l);
    if (st == MF_OK)
        *size = l.total;
    return st;
}

mf_status_t mf_row_init(void *buf, size_t cap, const mf_row_spec_t *spec,
                        uint32_t n_cols, const uint32_t *cols, const uint64_t *head_mask,
                        mf_row_wview_t *out, const char **why)
{
    const char *dummy;
    mf_row_layout_t l;
    if (!why)
        why = &dummy;
    *why = "";
    if (!spec || !spec->model || !spec->tokens || !cols || !head_mask || !out) {
        *why = "null argument";
        return MF_INVALID_ARGUMENT;
    }
    size_t model_len = strlen(spec->model);
    if (model_len < 1 || model_len > MF_ROW_MAX_MODEL) {
        *why = "model id must be 1..255 bytes";
        return MF_INVALID_ARGUMENT;
    }
    if (!(spec->top_p > 0.0f && spec->top_p <= 1.0f)) {
        *why = "top_p must be in (0, 1]";
        return MF_INVALID_ARGUMENT;
    }
    if (!mf_row_block_size_ok(spec->block_size) || spec->n_heads < 1 ||
        spec->n_heads > MF_ROW_MAX_HEADS || (unsigned)spec->codec >= MF_CODEC_COUNT) {
        *why = "block size, head count or codec out of range";
        return MF_INVALID_ARGUMENT;
    }
    mf_status_t st = check_columns(spec->block_index, spec->n_heads, n_cols, cols,
                                   head_mask, why);
    if (st != MF_OK)
        return st;
    uint32_t e = count_entries(n_cols, head_mask);
    st = mf_row_layout(spec->codec, spec->block_size, spec->n_heads, n_cols, e,
                       (uint32_t)model_len, &l);
    if (st != MF_OK) {
        *why = "row too large";
        return st;
    }
    out->size = l.total;
    if (!buf || cap < l.total) {
        *why = "buffer too small";
        return MF_RESOURCE_EXHAUSTED;
    }
    if (((uintptr_t)buf & (MF_ROW_ALIGN - 1)) != 0) {
        *why = "row buffer not 16-byte aligned";
        return MF_INVALID_ARGUMENT;
    }
    uint8_t *p = buf;
    memset(p, 0, l.tiles); /* header, padding, masses and scales; tiles are the caller's */
    mf_row_header_t *h = (mf_row_header_t *)p;
    h->magic = MF_ROW_MAGIC;
    h->version = MF_ROW_VERSION;
    h->codec = (uint8_t)spec->codec;
    h->model_len = (uint8_t)model_len;
    h->total_size = (uint32_t)l.total;
    h->layer = spec->layer;
    h->block_index = spec->block_index;
    h->block_size = (uint16_t)spec->block_size;
    h->n_heads = (uint16_t)spec->n_heads;
    h->n_cols = n_cols;
    h->n_entries = e;
    h->top_p = spec->top_p;
    mf_hash_to_le(spec->parent, h->parent);
    mf_hash_to_le(spec->hash, h->hash);
    memcpy(p + l.model, spec->model, model_len);
    memcpy(p + l.tokens, spec->tokens, 4ull * spec->block_size);
    memcpy(p + l.cols, cols, 4ull * n_cols);
    uint32_t *coff = (uint32_t *)(p + l.col_off);
    uint32_t acc = 0;
    for (uint32_t c = 0; c < n_cols; c++) {
        coff[c] = acc;
        acc += (uint32_t)__builtin_popcountll(head_mask[c]);
    }
    memcpy(p + l.head_mask, head_mask, 8ull * n_cols);
    out->mass = p + l.mass;
    out->scales = codec_has_scales(spec->codec) ? (float *)(p + l.scales) : NULL;
    out->tiles = l.tile_bytes ? p + l.tiles : NULL;
    out->tile_bytes = l.tile_bytes;
    out->n_entries = e;
    return MF_OK;
}

mf_status_t mf_row_seal(void *buf, size_t len)
{
    if (!buf || len < MF_ROW_HEADER)
        return MF_INVALID_ARGUMENT;
    mf_row_header_t *h = buf;
    if (h->magic != MF_ROW_MAGIC || h->total_size != len)
        return MF_INVALID_ARGUMENT;
    h->checksum = row_checksum(buf, h->total_size);
    return MF_OK;
}

float mf_tile_encode(mf_codec_t codec, uint32_t b, const float *src, void *dst)
{
    size_t n = (size_t)b * b;
    float m = 0.0f;
    switch (codec) {
    case MF_CODEC_FP16:
        for (size_t k = 0; k < n; k++)
            ((uint16_t *)dst)[k] = mf_f32_to_f16(src[k]);
        return 0.0f;
    case MF_CODEC_BF16:
        for (size_t k = 0; k < n; k++)
            ((uint16_t *)dst)[k] = mf_f32_to_bf16(src[k]);
        return 0.0f;
    case MF_CODEC_FP8_E4M3:
    case MF_CODEC_U8_LOG:
        for (size_t k = 0; k < n; k++)
            if (src[k] > m)
                m = src[k];
        for (size_t k = 0; k < n; k++)
            ((uint8_t *)dst)[k] = codec == MF_CODEC_FP8_E4M3 ? mf_fp8_encode(src[k], m)
                                                             : mf_u8log_encode(src[k], m);
        return m;
    default:
        return 0.0f;
    }
}

static float tile_elem(mf_codec_t codec, const void *t, size_t k, float scale)
{
    switch (codec) {
    case MF_CODEC_FP16:
        return mf_f16_to_f32(((const uint16_t *)t)[k]);
    case MF_CODEC_BF16:
        return mf_bf16_to_f32(((const uint16_t *)t)[k]);
    case MF_CODEC_FP8_E4M3:
        return mf_fp8_decode(((const uint8_t *)t)[k], scale);
    case MF_CODEC_U8_LOG:
        return mf_u8log_decode(((const uint8_t *)t)[k], scale);
    default:
        return 0.0f;
    }
}

void mf_tile_decode(mf_codec_t codec, uint32_t b, const void *src, float scale, float *dst)
{
    size_t n = (size_t)b * b;
    for (size_t k = 0; k < n; k++)
        dst[k] = tile_elem(codec, src, k, scale);
}

mf_status_t mf_row_build(void *buf, size_t cap, const mf_row_spec_t *spec,
                         uint32_t n_cols, const uint32_t *cols, const uint64_t *head_mask,
                         const float *mass, const float *tiles, size_t *size,
                         const char **why)
{
    const char *dummy;
    mf_row_wview_t w;
    if (!why)
        why = &dummy;
    mf_status_t st = mf_row_init(buf, cap, spec, n_cols, cols, head_mask, &w, why);
    if (size && (st == MF_OK || st == MF_RESOURCE_EXHAUSTED))
        *size = w.size;
    if (st != MF_OK)
        return st;
    if (!mass || (spec->codec != MF_CODEC_MASK && !tiles)) {
        *why = "masses (and tiles for a prob codec) are required";
        return MF_INVALID_ARGUMENT;
    }
    size_t bb = (size_t)spec->block_size * spec->block_size;
    for (uint32_t e = 0; e < w.n_entries; e++) {
        w.mass[e] = mf_mass_encode(mass[e]);
        if (w.tiles) {
            float s = mf_tile_encode(spec->codec, spec->block_size, tiles + e * bb,
                                     (uint8_t *)w.tiles + e * w.tile_bytes);
            if (w.scales)
                w.scales[e] = s;
        }
    }
    return mf_row_seal(buf, w.size);
}

#define FAIL(status, msg) \
    do {                  \
        *why = (msg);     \
        return (status);  \
    } while (0)

mf_status_t mf_row_decode(const void *buf, size_t len, unsigned flags,
                          mf_row_view_t *v, const char **why)
{
    const char *dummy;
    mf_row_layout_t l;
    if (!why)
        why = &dummy;
    *why = "";
    if (!buf || !v)
        FAIL(MF_INVALID_ARGUMENT, "null argument");
    if (((uintptr_t)buf & (MF_ROW_ALIGN - 1)) != 0)
        FAIL(MF_INVALID_ARGUMENT, "row buffer not 16-byte aligned");
    if (len < MF_ROW_HEADER)
        FAIL(MF_INVALID_ARGUMENT, "row shorter than its header");
    const uint8_t *p = buf;
    const mf_row_header_t *h = buf;
    if (h->magic != MF_ROW_MAGIC)
        FAIL(MF_INVALID_ARGUMENT, "bad magic (not a map row)");
    if (h->version != MF_ROW_VERSION)
        FAIL(MF_UNIMPLEMENTED, "unsupported row version");
    if (h->codec >= MF_CODEC_COUNT)
        FAIL(MF_INVALID_ARGUMENT, "unknown codec");
    if (h->flags != 0)
        FAIL(MF_INVALID_ARGUMENT, "reserved flags set");
    if (!mf_row_block_size_ok(h->block_size))
        FAIL(MF_INVALID_ARGUMENT, "block size not a power of two in [8, 256]");
    if (h->n_heads < 1 || h->n_heads > MF_ROW_MAX_HEADS)
        FAIL(MF_INVALID_ARGUMENT, "head count out of range (1..64)");
    if (h->model_len < 1)
        FAIL(MF_INVALID_ARGUMENT, "empty model id");
    if (h->n_cols < 1 || (uint64_t)h->n_cols > (uint64_t)h->block_index + 1)
        FAIL(MF_INVALID_ARGUMENT, "column count out of range (must be 1..i+1)");
    if ((uint64_t)h->n_entries > (uint64_t)h->n_cols * h->n_heads)
        FAIL(MF_INVALID_ARGUMENT, "entry count exceeds columns x heads");
    if (!(h->top_p > 0.0f && h->top_p <= 1.0f))
        FAIL(MF_INVALID_ARGUMENT, "top_p out of (0, 1]");
    if (h->total_size != len)
        FAIL(MF_INVALID_ARGUMENT, "size in header disagrees with the row length");
    if (mf_row_layout((mf_codec_t)h->codec, h->block_size, h->n_heads, h->n_cols,
                      h->n_entries, h->model_len, &l) != MF_OK || l.total != len)
        FAIL(MF_INVALID_ARGUMENT, "section sizes disagree with the row length");
    if (!(flags & MF_ROW_NO_CHECKSUM) && row_checksum(p, len) != h->checksum)
        FAIL(MF_DATA_LOSS, "checksum mismatch");

    const uint32_t *cols = (const uint32_t *)(p + l.cols);
    const uint32_t *coff = (const uint32_t *)(p + l.col_off);
    const uint64_t *mask = (const uint64_t *)(p + l.head_mask);
    mf_status_t st = check_columns(h->block_index, h->n_heads, h->n_cols, cols, mask, why);
    if (st != MF_OK)
        return st;
    uint64_t acc = 0;
    for (uint32_t c = 0; c < h->n_cols; c++) {
        if (coff[c] != acc)
            FAIL(MF_INVALID_ARGUMENT, "column offsets disagree with the head bitmasks");
        acc += (uint64_t)__builtin_popcountll(mask[c]);
    }
    if (acc != h->n_entries)
        FAIL(MF_INVALID_ARGUMENT, "entry count disagrees with the head bitmasks");
    const float *scales = codec_has_scales((mf_codec_t)h->codec)
                              ? (const float *)(p + l.scales) : NULL;
    if (scales)
        for (uint32_t e = 0; e < h->n_entries; e++)
            if (!(scales[e] >= 0.0f && scales[e] <= 1.0f))
                FAIL(MF_INVALID_ARGUMENT, "tile scale outside [0, 1]");

    v->base = p;
    v->size = len;
    v->codec = (mf_codec_t)h->codec;
    v->layer = h->layer;
    v->block_index = h->block_index;
    v->block_size = h->block_size;
    v->n_heads = h->n_heads;
    v->n_cols = h->n_cols;
    v->n_entries = h->n_entries;
    v->top_p = h->top_p;
    v->model = (const char *)(p + l.model);
    v->model_len = h->model_len;
    v->parent = mf_hash_from_le(h->parent);
    v->hash = mf_hash_from_le(h->hash);
    v->tokens = (const uint32_t *)(p + l.tokens);
    v->cols = cols;
    v->col_off = coff;
    v->head_mask = mask;
    v->mass = p + l.mass;
    v->scales = scales;
    v->tiles = l.tile_bytes ? p + l.tiles : NULL;
    v->tile_bytes = l.tile_bytes;
    return MF_OK;
}

float mf_row_mass(const mf_row_view_t *v, uint32_t entry)
{
    return mf_mass_decode(v->mass[entry]);
}

float mf_row_tile_value(const mf_row_view_t *v, uint32_t entry, uint32_t q, uint32_t k)
{
    if (!v->tiles)
        return 0.0f;
    const uint8_t *t = (const uint8_t *)v->tiles + (size_t)entry * v->tile_bytes;
    return tile_elem(v->codec, t, (size_t)q * v->block_size + k,
                     v->scales ? v->scales[entry] : 0.0f);
}

mf_status_t mf_row_peek(const void *buf, size_t len, mf_row_view_t *v, const char **why)
{
    mf_row_header_t h;
    *why = "stored row's header is damaged";
    if (!buf || len < MF_ROW_HEADER || ((uintptr_t)buf & (MF_ROW_ALIGN - 1)))
        return MF_DATA_LOSS;
    memcpy(&h, buf, sizeof(h)); /* each field read once */
    size_t toff = (MF_ROW_HEADER + (size_t)h.model_len + MF_ROW_ALIGN - 1) &
                  ~(size_t)(MF_ROW_ALIGN - 1);
    if (h.magic != MF_ROW_MAGIC || h.version != MF_ROW_VERSION || h.total_size != len ||
        h.model_len < 1 || toff + (size_t)h.block_size * 4 > len)
        return MF_DATA_LOSS;
    const uint8_t *p = buf;
    memset(v, 0, sizeof(*v));
    v->base = p;
    v->size = len;
    v->codec = (mf_codec_t)h.codec;
    v->layer = h.layer;
    v->block_index = h.block_index;
    v->block_size = h.block_size;
    v->n_heads = h.n_heads;
    v->n_cols = h.n_cols;
    v->n_entries = h.n_entries;
    v->top_p = h.top_p;
    v->model = (const char *)(p + MF_ROW_HEADER);
    v->model_len = h.model_len;
    v->parent = mf_hash_from_le(h.parent);
    v->hash = mf_hash_from_le(h.hash);
    v->tokens = (const uint32_t *)(p + toff);
    *why = "";
    return MF_OK;
}

int mf_row_match(const mf_row_view_t *v, const mf_row_want_t *w, const char **why)
{
    unsigned f = w->fields;
    if ((f & MF_MATCH_MODEL) &&
        (v->model_len != w->model_len || memcmp(v->model, w->model, w->model_len)))
        *why = "row's model differs from the request";
    else if ((f & MF_MATCH_LAYER) && v->layer != w->layer)
        *why = "row's layer differs from the request";
    else if ((f & MF_MATCH_BLOCK) && v->block_index != w->block_index)
        *why = "row's block index differs from the request";
    else if ((f & MF_MATCH_BLOCK_SIZE) && v->block_size != w->block_size)
        *why = "row's block size differs from the request";
    else if ((f & MF_MATCH_PARENT) && !mf_hash_eq(v->parent, w->parent))
        *why = "row's parent hash differs from the request";
    else if ((f & MF_MATCH_HASH) && !mf_hash_eq(v->hash, w->hash))
        *why = "row's hash differs from the request";
    else if ((f & MF_MATCH_TOKENS) == MF_MATCH_TOKENS && w->tokens &&
             memcmp(v->tokens, w->tokens, (size_t)w->block_size * sizeof(uint32_t)))
        *why = "row's tokens differ from the request";
    else
        return 1;
    return 0;
}
