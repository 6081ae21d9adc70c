/*
 * backend — mapflow-worker's choice of device: one interface over gpt.h + handoff.h (cpu)
 * and gpt_cuda.h + handoff_cuda.h (cuda), so the source and target code runs unchanged on
 * either. "cuda" exists when the worker was built with nvcc (MFW_HAVE_CUDA: the CUDA
 * runtime is linked statically and finds the driver at run time, so the same binary runs
 * its CPU path on a machine with no GPU and no libcuda).
 *
 * Ownership: a backend borrows the CPU model (it must outlive the backend) and owns its
 * device copy; a run owns its cache. Thread safety: one thread per run; open/free on the
 * main thread.
 */
#ifndef MFW_BACKEND_H
#define MFW_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "gpt.h"
#include "handoff.h"

typedef struct mfw_backend mfw_backend_t;
typedef struct mfw_brun mfw_brun_t;

typedef enum mfw_hook {
    MFW_HOOK_NONE,           /* plain attention */
    MFW_HOOK_EXTRACT,        /* ctx: mfw_extract_t (source) */
    MFW_HOOK_REUSE,          /* ctx: mfw_reuse_t (target), after mfw_backend_reuse_prepare */
} mfw_hook_t;

/*
 * device "cpu", "cuda" or "auto" (cuda when built with it, a GPU is usable and the model
 * fits the CUDA kernels; else cpu). "cuda" that cannot be had fails: MF_UNAVAILABLE (no
 * GPU or driver), MF_UNIMPLEMENTED (built without CUDA, or the model does not fit), with
 * err. A cuda backend is warmed up (kernels loaded, allocator primed) before it returns,
 * so the caller's first timing is not the CUDA start-up.
 */
mf_status_t mfw_backend_open(const mfw_gpt_t *m, const char *device, mfw_backend_t **out,
                             char *err, size_t errlen);
void mfw_backend_free(mfw_backend_t *b);
int mfw_backend_is_cuda(const mfw_backend_t *b);
/* "cpu", or "cuda (<device name>)"; for auto that fell back, "cpu (<why not cuda>)". */
const char *mfw_backend_desc(const mfw_backend_t *b);
/* The CUDA ordinal the model runs on (for MF_CHANNEL_PARAM_GPU), -1 on the cpu. */
int mfw_backend_gpu(const mfw_backend_t *b);

mf_status_t mfw_brun_create(mfw_backend_t *b, uint32_t max_tokens, mfw_brun_t **out);
void mfw_brun_free(mfw_brun_t *r);
/* mfw_gpt_forward / mfw_gpt_cuda_forward with the device's hook of that kind; logits is
 * host memory. */
mf_status_t mfw_brun_forward(mfw_brun_t *r, const uint32_t *tokens, uint32_t n, mfw_hook_t hook,
                             void *ctx, uint32_t logits_from, float *logits);
/* The device's message for the last failure outside a hook ("" if none). */
const char *mfw_brun_error(const mfw_brun_t *r);

/* After a source prefill: rows extracted on the device (e->dev_rows) copied to e->rows,
 * for a channel that cannot take device rows. Release frees e's rows, host and device. */
mf_status_t mfw_backend_extract_to_host(mfw_backend_t *b, mfw_extract_t *e);
void mfw_backend_extract_release(mfw_backend_t *b, mfw_extract_t *e);

/* Before a reuse prefill: cuda copies r's rows to the device (timed by the caller); cpu
 * does nothing. Release undoes it (safe to call either way). */
mf_status_t mfw_backend_reuse_prepare(mfw_backend_t *b, mfw_reuse_t *r);
void mfw_backend_reuse_release(mfw_backend_t *b, mfw_reuse_t *r);

#endif /* MFW_BACKEND_H */
