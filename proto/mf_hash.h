/*
 * mf_hash — the prefix hash of DESIGN §4, exactly as specified there.
 *
 *   h(-1) = XXH3_128bits("mapflow/v1" || B as u32 LE || namespace || 0x00 || model)
 *   h(i)  = XXH3_128bits(h(i-1) as 16 bytes LE || tokens[iB:(i+1)B] as u32 LE)
 *
 * No seeds, no randomness: every process on every node computes the same hashes.
 * Only full blocks are hashed. Text form: 32 lower-case hex digits, most significant
 * first (XXH128 canonical form).
 *
 * Ownership: callers own every buffer. Thread safety: all functions are pure.
 */
#ifndef MF_HASH_H
#define MF_HASH_H

#include <stddef.h>
#include <stdint.h>
#include "mf_status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mf_hash128 {
    uint64_t lo;
    uint64_t hi;
} mf_hash128_t;

#define MF_HASH_HEX_LEN 32 /* without the terminating NUL */

/* h(-1): the root for (block size, namespace, model). ns/model are UTF-8, len bytes. */
mf_hash128_t mf_hash_root(uint32_t block_size, const char *ns, size_t ns_len,
                          const char *model, size_t model_len);

/* h(i) from h(i-1) and the B tokens of block i. */
mf_hash128_t mf_hash_next(mf_hash128_t prev, const uint32_t *tokens, uint32_t block_size);

/*
 * Hashes of every full block of `tokens[0:n_tokens]` into out[0..n_tokens/B).
 * Returns MF_INVALID_ARGUMENT if block_size is 0 or out_cap is smaller than needed;
 * *n_out receives the number of full blocks.
 */
mf_status_t mf_hash_prefix(const char *ns, const char *model, uint32_t block_size,
                           const uint32_t *tokens, size_t n_tokens,
                           mf_hash128_t *out, size_t out_cap, size_t *n_out);

/* 16 bytes little-endian: lo as u64 LE, then hi as u64 LE (the form hashed and stored). */
void mf_hash_to_le(mf_hash128_t h, uint8_t out[16]);
mf_hash128_t mf_hash_from_le(const uint8_t in[16]);

/* Canonical text; `out` must hold MF_HASH_HEX_LEN + 1 bytes. */
void mf_hash_to_hex(mf_hash128_t h, char out[MF_HASH_HEX_LEN + 1]);
/* Parses exactly 32 hex digits (either case); MF_INVALID_ARGUMENT otherwise. */
mf_status_t mf_hash_from_hex(const char *hex, mf_hash128_t *out);

static inline int mf_hash_eq(mf_hash128_t a, mf_hash128_t b)
{
    return a.lo == b.lo && a.hi == b.hi;
}

#ifdef __cplusplus
}
#endif
#endif /* MF_HASH_H */
