/* backend — see backend.h. */
#include "backend.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef MFW_HAVE_CUDA
#include "gpt_cuda.h"
#include "handoff_cuda.h"
#endif

struct mfw_backend {
    const mfw_gpt_t *m;
    int gpu;                 /* CUDA ordinal, -1: cpu */
#ifdef MFW_HAVE_CUDA
    mfw_gpt_cuda_t *g;       /* NULL: cpu */
#endif
    char desc[256];
};

struct mfw_brun {
    mfw_backend_t *b;
    mfw_run_t *cpu;
#ifdef MFW_HAVE_CUDA
    mfw_run_cuda_t *gpu;
#endif
};

int mfw_backend_is_cuda(const mfw_backend_t *b)
{
#ifdef MFW_HAVE_CUDA
    return b->g != NULL;
#else
    (void)b;
    return 0;
#endif
}

const char *mfw_backend_desc(const mfw_backend_t *b)
{
    return b->desc;
}

int mfw_backend_gpu(const mfw_backend_t *b)
{
    return b->gpu;
}

void mfw_backend_free(mfw_backend_t *b)
{
    if (!b)
        return;
#ifdef MFW_HAVE_CUDA
    mfw_gpt_cuda_free(b->g);
#endif
    free(b);
}

#ifdef MFW_HAVE_CUDA
/* A short prefill and one decode step: loads the kernels and primes the allocator. */
static mf_status_t warm_up(mfw_backend_t *b)
{
    uint32_t tok[129] = { 0 };
    mfw_brun_t *r = NULL;
    mf_status_t st = mfw_brun_create(b, 129, &r);
    if (st == MF_OK)
        st = mfw_brun_forward(r, tok, 128, MFW_HOOK_NONE, NULL, 128, NULL);
    if (st == MF_OK)
        st = mfw_brun_forward(r, tok + 128, 1, MFW_HOOK_NONE, NULL, 0, NULL);
    mfw_brun_free(r);
    return st;
}

static mf_status_t open_cuda(mfw_backend_t *b, char *err, size_t errlen)
{
    /* Load every kernel when the context starts, not at its first launch (inside a
     * timed prefill); the user's own setting wins. */
    setenv("CUDA_MODULE_LOADING", "EAGER", 0);
    char why[200] = "", name[200] = "";
    if (!mfw_cuda_usable(why, sizeof why)) {
        snprintf(err, errlen, "no usable CUDA device: %s", why);
        return MF_UNAVAILABLE;
    }
    mf_status_t st = mfw_gpt_cuda_load(b->m, &b->g, &b->gpu, name, sizeof name, err, errlen);
    if (st == MF_OK && (st = warm_up(b)) != MF_OK) {
        snprintf(err, errlen, "CUDA warm-up: %s", mf_status_name(st));
        mfw_gpt_cuda_free(b->g);
        b->g = NULL;
        b->gpu = -1;
    }
    if (st == MF_OK)
        snprintf(b->desc, sizeof b->desc, "cuda (%s)", name);
    return st;
}
#endif

mf_status_t mfw_backend_open(const mfw_gpt_t *m, const char *device, mfw_backend_t **out,
                             char *err, size_t errlen)
{
    *out = NULL;
    int cpu = !strcmp(device, "cpu"), cuda = !strcmp(device, "cuda"), any = !strcmp(device, "auto");
    if (!cpu && !cuda && !any) {
        snprintf(err, errlen, "--device %s: cpu, cuda or auto", device);
        return MF_INVALID_ARGUMENT;
    }
    mfw_backend_t *b = calloc(1, sizeof *b);
    if (!b)
        return MF_RESOURCE_EXHAUSTED;
    b->m = m;
    b->gpu = -1;
    snprintf(b->desc, sizeof b->desc, "cpu");
    mf_status_t st = MF_OK;
    if (!cpu) {
#ifdef MFW_HAVE_CUDA
        char why[300] = "";
        st = open_cuda(b, why, sizeof why);
#else
        char why[] = "this mapflow-worker was built without CUDA (no nvcc)";
        st = MF_UNIMPLEMENTED;
#endif
        if (st != MF_OK && any) {
            snprintf(b->desc, sizeof b->desc, "cpu (%s)", why);
            st = MF_OK;
        } else if (st != MF_OK) {
            snprintf(err, errlen, "--device cuda: %s", why);
        }
    }
    if (st != MF_OK) {
        mfw_backend_free(b);
        return st;
    }
    *out = b;
    return MF_OK;
}

mf_status_t mfw_brun_create(mfw_backend_t *b, uint32_t max_tokens, mfw_brun_t **out)
{
    *out = NULL;
    mfw_brun_t *r = calloc(1, sizeof *r);
    if (!r)
        return MF_RESOURCE_EXHAUSTED;
    r->b = b;
    mf_status_t st;
#ifdef MFW_HAVE_CUDA
    if (b->g)
        st = mfw_run_cuda_create(b->g, max_tokens, &r->gpu);
    else
#endif
        st = mfw_run_create(b->m, max_tokens, &r->cpu);
    if (st != MF_OK) {
        free(r);
        return st;
    }
    *out = r;
    return MF_OK;
}

void mfw_brun_free(mfw_brun_t *r)
{
    if (!r)
        return;
    mfw_run_free(r->cpu);
#ifdef MFW_HAVE_CUDA
    mfw_run_cuda_free(r->gpu);
#endif
    free(r);
}

mf_status_t mfw_brun_forward(mfw_brun_t *r, const uint32_t *tokens, uint32_t n, mfw_hook_t hook,
                             void *ctx, uint32_t logits_from, float *logits)
{
#ifdef MFW_HAVE_CUDA
    if (r->gpu) {
        mfw_cuda_attn_fn fn = hook == MFW_HOOK_EXTRACT ? mfw_extract_cuda_hook
                              : hook == MFW_HOOK_REUSE ? mfw_reuse_cuda_hook : NULL;
        return mfw_gpt_cuda_forward(r->b->g, r->gpu, tokens, n, fn, ctx, logits_from, logits);
    }
#endif
    mfw_attn_fn fn = hook == MFW_HOOK_EXTRACT ? mfw_extract_hook
                     : hook == MFW_HOOK_REUSE ? mfw_reuse_hook : NULL;
    return mfw_gpt_forward(r->b->m, r->cpu, tokens, n, fn, ctx, logits_from, logits);
}

const char *mfw_brun_error(const mfw_brun_t *r)
{
#ifdef MFW_HAVE_CUDA
    if (r->gpu)
        return mfw_run_cuda_error(r->gpu);
#else
    (void)r;
#endif
    return "";
}

mf_status_t mfw_backend_reuse_prepare(mfw_backend_t *b, mfw_reuse_t *r)
{
#ifdef MFW_HAVE_CUDA
    if (b->g)
        return mfw_reuse_cuda_upload(r);
#else
    (void)b;
    (void)r;
#endif
    return MF_OK;
}

void mfw_backend_reuse_release(mfw_backend_t *b, mfw_reuse_t *r)
{
#ifdef MFW_HAVE_CUDA
    if (b->g)
        mfw_reuse_cuda_release(r);
#else
    (void)b;
    (void)r;
#endif
}

mf_status_t mfw_backend_extract_to_host(mfw_backend_t *b, mfw_extract_t *e)
{
#ifdef MFW_HAVE_CUDA
    if (b->g)
        return mfw_extract_cuda_to_host(e);
#else
    (void)b;
    (void)e;
#endif
    return MF_OK;
}

void mfw_backend_extract_release(mfw_backend_t *b, mfw_extract_t *e)
{
#ifdef MFW_HAVE_CUDA
    if (b->g)
        mfw_extract_cuda_release(e);
#else
    (void)b;
#endif
    mfw_extract_release(e);
}
