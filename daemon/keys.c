/* keys — keys, tokens and prefix hashes from a request (see keys.h). */
#include "keys.h"

#include <stdlib.h>
#include <string.h>

mf_status_t mfd_keys_from_msg(const mfd_conn_t *c, const Mapflow__V1__Key *k, mfd_key_t *out,
                              const char **why)
{
    if (!k) {
        *why = "missing key";
        return MF_INVALID_ARGUMENT;
    }
    size_t ml = k->model ? strlen(k->model) : 0;
    if (ml < 1 || ml > MFD_MODEL_MAX || mfd_has_control(k->model)) {
        *why = "key.model must be 1..255 bytes without control characters";
        return MF_INVALID_ARGUMENT;
    }
    if (k->hash.len != 16) {
        *why = "key.hash must be 16 bytes";
        return MF_INVALID_ARGUMENT;
    }
    mfd_key_make(out, c->ns, c->ns_len, k->model, ml, k->layer, k->hash.data);
    return MF_OK;
}

mf_status_t mfd_keys_check_model(const char *model, const char **why)
{
    size_t ml = model ? strlen(model) : 0;
    if (ml < 1 || ml > MFD_MODEL_MAX || mfd_has_control(model)) {
        *why = "model must be 1..255 bytes without control characters";
        return MF_INVALID_ARGUMENT;
    }
    return MF_OK;
}

mf_status_t mfd_keys_check_model_block(const char *model, uint32_t B, const char **why)
{
    mf_status_t st = mfd_keys_check_model(model, why);
    if (st != MF_OK)
        return st;
    if (B < MF_ROW_MIN_BLOCK || B > MF_ROW_MAX_BLOCK || (B & (B - 1))) {
        *why = "block_size must be a power of two in [8, 256]";
        return MF_INVALID_ARGUMENT;
    }
    return MF_OK;
}

mf_status_t mfd_keys_tokens(const uint8_t *p, size_t len, uint32_t **out, size_t *n,
                            const char **why)
{
    if (len % 4) {
        *why = "token payload length is not a multiple of 4";
        return MF_INVALID_ARGUMENT;
    }
    *n = len / 4;
    *out = malloc(len ? len : 4);
    if (!*out) {
        *why = "out of memory";
        return MF_RESOURCE_EXHAUSTED;
    }
    memcpy(*out, p, len);
    return MF_OK;
}

mf_status_t mfd_keys_prefix_hashes(const mfd_conn_t *c, const char *model, uint32_t B,
                                   const uint32_t *tokens, size_t n_blocks,
                                   mf_hash128_t **out)
{
    mf_hash128_t *h = malloc((n_blocks + 1) * sizeof(*h));
    if (!h)
        return MF_RESOURCE_EXHAUSTED;
    h[0] = mf_hash_root(B, c->ns, c->ns_len, model, strlen(model));
    for (size_t b = 0; b < n_blocks; b++)
        h[b + 1] = mf_hash_next(h[b], tokens + b * B, B);
    *out = h;
    return MF_OK;
}

void mfd_keys_tmpl_init(mfd_keys_tmpl_t *t, const mfd_conn_t *c, const char *model)
{
    static const uint8_t zero[16];
    mfd_key_make(&t->k, c->ns, c->ns_len, model, strlen(model), 0, zero);
    t->at = t->k.len - 20u;
}

const mfd_key_t *mfd_keys_tmpl_set(mfd_keys_tmpl_t *t, uint32_t layer, mf_hash128_t h)
{
    uint8_t *p = t->k.b + t->at;
    p[0] = (uint8_t)(layer >> 24);
    p[1] = (uint8_t)(layer >> 16);
    p[2] = (uint8_t)(layer >> 8);
    p[3] = (uint8_t)layer;
    mf_hash_to_le(h, p + 4);
    return &t->k;
}

