/*
 * keys — what a request names, checked and turned into store keys under the connection's
 * namespace (so other namespaces are unreachable): one Key message, a (model, block_size)
 * pair, the u32 token payload, the prefix hashes h(-1) .. h(n-1) of DESIGN §4, and a key
 * template for probing many (layer, block) keys of one (namespace, model).
 * Bounds: model 1..255 bytes without control bytes, hash 16 bytes, block_size a power of
 * two in [8, 256], token payloads a multiple of 4 (their count is bounded by the frame).
 *
 * Ownership: *out arrays (tokens, hashes) are malloc'd for the caller.
 * Thread safety: none needed (pure functions of their arguments).
 */
#ifndef MFD_KEYS_H
#define MFD_KEYS_H

#include <stddef.h>
#include <stdint.h>
#include "conn.h"
#include "mf_hash.h"

/* k under c's namespace; MF_INVALID_ARGUMENT with *why for a bad model or hash. */
mf_status_t mfd_keys_from_msg(const mfd_conn_t *c, const Mapflow__V1__Key *k, mfd_key_t *out,
                              const char **why);
/* A model name from the wire: 1..255 bytes, no control characters (MF_INVALID_ARGUMENT). */
mf_status_t mfd_keys_check_model(const char *model, const char **why);
/* mfd_keys_check_model and a block size B that is a power of two in [8, 256]. */
mf_status_t mfd_keys_check_model_block(const char *model, uint32_t B, const char **why);
/* Aligned copy of the u32 tokens of a payload (frames are not 4-byte aligned). */
mf_status_t mfd_keys_tokens(const uint8_t *p, size_t len, uint32_t **out, size_t *n,
                            const char **why);
/* Hashes h(-1) .. h(n-1) into (*out)[0..n] ((*out)[0] = root). */
mf_status_t mfd_keys_prefix_hashes(const mfd_conn_t *c, const char *model, uint32_t B,
                                   const uint32_t *tokens, size_t n_blocks,
                                   mf_hash128_t **out);

/* The key of (namespace, model) built once; each probe patches layer and hash in. */
typedef struct mfd_keys_tmpl {
    mfd_key_t k;
    size_t at;               /* offset of the layer (then the hash) in k.b */
} mfd_keys_tmpl_t;

void mfd_keys_tmpl_init(mfd_keys_tmpl_t *t, const mfd_conn_t *c, const char *model);
const mfd_key_t *mfd_keys_tmpl_set(mfd_keys_tmpl_t *t, uint32_t layer, mf_hash128_t h);

#endif /* MFD_KEYS_H */
