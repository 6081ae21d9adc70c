/*
 * tokenizer — the byte-level BPE of the small model pair (bench/quality/train_small.py
 * trains it and defines the file): ids 0..255 are bytes, id 256 + r is merge r.
 *
 * File: "mapflow-bpe 1\n", the merge count M (≤ 1 << 20), then M lines "A B" (ids below
 * 256 + the line's rank). Encoding: the text is cut into chunks (an optional space and a
 * run of letters [A-Za-z, bytes ≥ 0x80], digits or other punctuation; whitespace runs give
 * their last byte to a following word), then in each chunk the adjacent pair of lowest
 * rank is merged everywhere left to right until no pair has a rank — exactly as the
 * Python trainer encodes.
 *
 * Ownership: the handle owns its tables; mfw_tok_bytes points into them. Thread safety:
 * read-only after load; any thread.
 */
#ifndef MFW_TOKENIZER_H
#define MFW_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "mf_status.h"

#define MFW_TOK_MAX_MERGES (1u << 20)

typedef struct mfw_tok mfw_tok_t;

/* MF_NOT_FOUND (no file) or MF_INVALID_ARGUMENT (malformed), message in err. */
mf_status_t mfw_tok_load(const char *path, mfw_tok_t **out, char *err, size_t errlen);
void mfw_tok_free(mfw_tok_t *t);

uint32_t mfw_tok_vocab(const mfw_tok_t *t);

/* Encodes len bytes of text into ids (cap entries). *n receives the count; when cap is too
 * small: MF_RESOURCE_EXHAUSTED and *n = the ids that fit. */
mf_status_t mfw_tok_encode(const mfw_tok_t *t, const char *text, size_t len, uint32_t *ids,
                           size_t cap, size_t *n);

/* The bytes of token id (NULL and *len = 0 for an id out of range). */
const char *mfw_tok_bytes(const mfw_tok_t *t, uint32_t id, size_t *len);

#endif /* MFW_TOKENIZER_H */
