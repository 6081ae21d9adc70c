/*
 * npy — a small, strict reader (and writer) of NumPy .npy files: format versions 1–3,
 * little-endian float32 ('<f4') or float16 ('<f2'), C order, up to 8 dimensions. Used by
 * mapflow-calibrate for sample attention maps ([L, H, N, N] per model per sequence).
 *
 * Every size is bounded before allocation: the header (≤ 64 KiB), the dimensions, the
 * element count (caller's max_elems) and the file size, which must equal header + data
 * exactly (a truncated or padded file is an error). Errors come back as a status plus a
 * message in the caller's buffer ("x.npy: dtype '>f8' not supported (need <f4 or <f2)").
 *
 * Ownership: mf_npy_read allocates out->data; mf_npy_free releases it. Thread safety:
 * no global state; any thread.
 */
#ifndef MF_NPY_H
#define MF_NPY_H

#include <stddef.h>
#include <stdint.h>

#include "mf_status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MF_NPY_MAX_DIMS   8
#define MF_NPY_MAX_HEADER 65536u

typedef enum mf_npy_dtype {
    MF_NPY_F32 = 0,
    MF_NPY_F16 = 1,
} mf_npy_dtype_t;

typedef struct mf_npy_header {
    mf_npy_dtype_t dtype;
    uint32_t ndim;
    uint64_t shape[MF_NPY_MAX_DIMS];
    uint64_t n_elems;
    size_t data_offset;    /* bytes from the file start to the first element */
} mf_npy_header_t;

typedef struct mf_npy {
    float *data;           /* n_elems floats, C order (f16 files are widened) */
    mf_npy_header_t hdr;
} mf_npy_t;

/*
 * Parses the header at the start of buf (len bytes, at least the whole header).
 * MF_INVALID_ARGUMENT (malformed / unsupported) or MF_OUT_OF_RANGE (over max_elems),
 * with a message in err.
 */
mf_status_t mf_npy_parse_header(const void *buf, size_t len, uint64_t max_elems,
                                mf_npy_header_t *hdr, char *err, size_t errlen);

/* Reads a whole file; MF_NOT_FOUND if it cannot be opened, MF_DATA_LOSS if truncated. */
mf_status_t mf_npy_read(const char *path, uint64_t max_elems, mf_npy_t *out, char *err,
                        size_t errlen);
void mf_npy_free(mf_npy_t *a);

/* Writes a version-1 .npy of float32 data as '<f4' or '<f2'. */
mf_status_t mf_npy_write(const char *path, mf_npy_dtype_t dtype, const float *data,
                         uint32_t ndim, const uint64_t *shape);

#ifdef __cplusplus
}
#endif
#endif /* MF_NPY_H */
