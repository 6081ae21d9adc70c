/*
 * safetensors — a strict reader of .safetensors files (u64 LE header length, a JSON header
 * naming each tensor's dtype, shape and byte range, then the raw data) for mapflow-worker.
 * Tensors come out widened to float32 (F32, F16, BF16 accepted).
 *
 * Every size is bounded before use: the file (≤ 1 GiB), the header (≤ 16 MiB), at most
 * 4096 tensors of up to 8 dimensions, byte ranges inside the data and equal to the shape's
 * size. Malformed input → MF_INVALID_ARGUMENT with a message ("x.safetensors: tensor
 * 'emb.weight': 12 bytes for shape [4, 4] F16"), never a crash.
 *
 * Ownership: mfw_st_open reads the whole file into memory the handle owns; tensors from
 * mfw_st_tensor are malloc'd for the caller (free()). Strings returned by mfw_st_meta live
 * as long as the handle. Thread safety: a handle is read-only after open; any thread.
 */
#ifndef MFW_SAFETENSORS_H
#define MFW_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "mf_status.h"

#define MFW_ST_MAX_FILE    (1ull << 30)
#define MFW_ST_MAX_HEADER  (16u << 20)
#define MFW_ST_MAX_TENSORS 4096u
#define MFW_ST_MAX_DIMS    8u

typedef struct mfw_st mfw_st_t;

/* Reads and parses path. On failure *out is NULL and err says why. */
mf_status_t mfw_st_open(const char *path, mfw_st_t **out, char *err, size_t errlen);
/* Parses an in-memory file (copied). name is used in messages only. */
mf_status_t mfw_st_parse(const void *buf, size_t len, const char *name, mfw_st_t **out,
                         char *err, size_t errlen);
void mfw_st_close(mfw_st_t *st);

/* Value of a __metadata__ key, or NULL. */
const char *mfw_st_meta(const mfw_st_t *st, const char *key);

/*
 * Tensor `name` as a new float32 array; its shape must be exactly shape[0..ndim).
 * MF_NOT_FOUND (no such tensor) or MF_INVALID_ARGUMENT (other shape), message in err.
 */
mf_status_t mfw_st_tensor(const mfw_st_t *st, const char *name, uint32_t ndim,
                          const uint64_t *shape, float **out, char *err, size_t errlen);

#endif /* MFW_SAFETENSORS_H */
