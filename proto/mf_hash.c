/* mf_hash — DESIGN §4 prefix hash over XXH3-128 (see mf_hash.h). */
#include "mf_hash.h"

#include <string.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include <xxhash.h>

static void put_u32le(uint8_t *p, uint32_t v)
{
    for (int k = 0; k < 4; k++)
        p[k] = (uint8_t)(v >> (8 * k));
}

static void put_u64le(uint8_t *p, uint64_t v)
{
    for (int k = 0; k < 8; k++)
        p[k] = (uint8_t)(v >> (8 * k));
}

static uint64_t get_u64le(const uint8_t *p)
{
    uint64_t v = 0;
    for (int k = 7; k >= 0; k--)
        v = (v << 8) | p[k];
    return v;
}

static mf_hash128_t from_xxh(XXH128_hash_t x)
{
    mf_hash128_t h = { x.low64, x.high64 };
    return h;
}

mf_hash128_t mf_hash_root(uint32_t block_size, const char *ns, size_t ns_len,
                          const char *model, size_t model_len)
{
    XXH3_state_t st;
    uint8_t b[4];
    const uint8_t zero = 0;

    put_u32le(b, block_size);
    XXH3_128bits_reset(&st);
    XXH3_128bits_update(&st, "mapflow/v1", 10);
    XXH3_128bits_update(&st, b, 4);
    XXH3_128bits_update(&st, ns, ns_len);
    XXH3_128bits_update(&st, &zero, 1);
    XXH3_128bits_update(&st, model, model_len);
    return from_xxh(XXH3_128bits_digest(&st));
}

mf_hash128_t mf_hash_next(mf_hash128_t prev, const uint32_t *tokens, uint32_t block_size)
{
    /* One contiguous buffer for the common block sizes keeps this a single XXH3 call. */
    uint8_t stackbuf[16 + 4 * 256];
    if (block_size <= 256) {
        mf_hash_to_le(prev, stackbuf);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
        memcpy(stackbuf + 16, tokens, 4 * (size_t)block_size); /* already LE */
#else
        for (uint32_t t = 0; t < block_size; t++)
            put_u32le(stackbuf + 16 + 4 * t, tokens[t]);
#endif
        return from_xxh(XXH3_128bits(stackbuf, 16 + 4 * (size_t)block_size));
    }
    XXH3_state_t st;
    uint8_t le[16];
    mf_hash_to_le(prev, le);
    XXH3_128bits_reset(&st);
    XXH3_128bits_update(&st, le, 16);
    for (uint32_t t = 0; t < block_size; t++) {
        uint8_t b[4];
        put_u32le(b, tokens[t]);
        XXH3_128bits_update(&st, b, 4);
    }
    return from_xxh(XXH3_128bits_digest(&st));
}

mf_status_t mf_hash_prefix(const char *ns, const char *model, uint32_t block_size,
                           const uint32_t *tokens, size_t n_tokens,
                           mf_hash128_t *out, size_t out_cap, size_t *n_out)
{
    if (block_size == 0 || !ns || !model || (n_tokens && !tokens))
        return MF_INVALID_ARGUMENT;
    size_t n = n_tokens / block_size;
    if (n_out)
        *n_out = n;
    if (n > out_cap || (n && !out))
        return MF_INVALID_ARGUMENT;
    mf_hash128_t h = mf_hash_root(block_size, ns, strlen(ns), model, strlen(model));
    for (size_t i = 0; i < n; i++) {
        h = mf_hash_next(h, tokens + i * block_size, block_size);
        out[i] = h;
    }
    return MF_OK;
}

void mf_hash_to_le(mf_hash128_t h, uint8_t out[16])
{
    put_u64le(out, h.lo);
    put_u64le(out + 8, h.hi);
}

mf_hash128_t mf_hash_from_le(const uint8_t in[16])
{
    mf_hash128_t h = { get_u64le(in), get_u64le(in + 8) };
    return h;
}

void mf_hash_to_hex(mf_hash128_t h, char out[MF_HASH_HEX_LEN + 1])
{
    static const char digits[] = "0123456789abcdef";
    for (int k = 0; k < 16; k++) {
        out[k] = digits[(h.hi >> (60 - 4 * k)) & 0xf];
        out[16 + k] = digits[(h.lo >> (60 - 4 * k)) & 0xf];
    }
    out[32] = '\0';
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

mf_status_t mf_hash_from_hex(const char *hex, mf_hash128_t *out)
{
    if (!hex || !out || strlen(hex) != MF_HASH_HEX_LEN)
        return MF_INVALID_ARGUMENT;
    uint64_t hi = 0, lo = 0;
    for (int k = 0; k < 32; k++) {
        int v = hexval(hex[k]);
        if (v < 0)
            return MF_INVALID_ARGUMENT;
        if (k < 16)
            hi = (hi << 4) | (uint64_t)v;
        else
            lo = (lo << 4) | (uint64_t)v;
    }
    out->hi = hi;
    out->lo = lo;
    return MF_OK;
}
