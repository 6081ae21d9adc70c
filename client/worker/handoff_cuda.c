/* handoff_cuda — see handoff_cuda.h. */
#include "handoff_cuda.h"

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ALIGN16(x) (((x) + 15) & ~(size_t)15)

static mf_status_t cuda_st(cudaError_t e, const char **why)
{
    if (e == cudaSuccess)
        return MF_OK;
    *why = cudaGetErrorString(e);
    return e == cudaErrorMemoryAllocation ? MF_RESOURCE_EXHAUSTED : MF_INTERNAL;
}

static void release_layer(mfw_extract_t *e, uint32_t l)
{
    mf_put_region_free(e->region[l]); /* aborts one not committed */
    e->region[l] = NULL;
    free(e->dev_rows[l]);
    cudaFree(e->dev_mem[l]);
    e->dev_rows[l] = NULL;
    e->dev_mem[l] = NULL;
}

void mfw_extract_cuda_release(mfw_extract_t *e)
{
    for (uint32_t l = 0; l < MFW_MAX_LAYERS; l++)
        release_layer(e, l);
}

/* Layer l's put region, reserved by the rows' capacities: e->region[l] and its row
 * addresses in e->dev_rows[l]. Any refusal leaves it NULL and the rows go to device
 * buffers: besides FAILED_PRECONDITION / RESOURCE_EXHAUSTED (no tier, no room), the
 * bounds of a large layer can exceed one arena (INVALID_ARGUMENT) while its actual rows,
 * put one by one, fit; a fault the row puts share is reported by them. */
static void region_begin(mfw_extract_t *e, uint32_t l, const size_t *caps, uint32_t nb)
{
    mf_put_region_params_t p = {.field_mask = MF_PUT_REGION_PARAM_CAPACITIES, .capacities = 1};
    mf_status_t st = mf_put_region_begin(e->region_ch, e->model, l, caps, nb, 0, &p,
                                         e->dev_rows[l], &e->region[l], MF_TIMEOUT_DEFAULT);
    if (st != MF_OK)
        snprintf(e->region_why, sizeof(e->region_why), "layer %u: %s: %s", l,
                 mf_status_name(st), mf_channel_last_error(e->region_ch));
}

mf_status_t mfw_extract_cuda_hook(void *ctx, const mfw_cuda_attn_args_t *a)
{
    mfw_extract_t *e = ctx;
    mf_status_t st = mfw_cuda_attention(a, &e->why);
    if (st != MF_OK || !mfw_extract_wants(e, a->layer, a->pos0, a->n))
        return st;
    uint32_t nb = a->n / e->block_size, l = a->layer, failed = UINT32_MAX;
    size_t *caps = calloc(nb, sizeof *caps), total = 0;
    uint64_t *sizes = calloc(nb, sizeof *sizes);
    uint32_t *entries = calloc(nb, sizeof *entries);
    release_layer(e, l);
    if (!caps || !sizes || !entries || !(e->dev_rows[l] = calloc(nb, sizeof(void *)))) {
        st = MF_RESOURCE_EXHAUSTED;
        goto out_host;
    }
    if ((st = mfw_extract_alloc(e, l, nb, a->n_heads, caps, 0)) != MF_OK)
        goto out_host;
    if (e->region_ch)
        region_begin(e, l, caps, nb);
    for (uint32_t i = 0; !e->region[l] && i < nb; i++)
        total += ALIGN16(caps[i]);
    /* one allocation: the rows (unless in a region), then sizes [nb] u64, then the failed
     * block u32 */
    uint8_t *dmem = NULL;
    if ((st = cuda_st(cudaMalloc((void **)&dmem, total + 8 * (size_t)nb + 4), &e->why)) != MF_OK)
        goto out_host;
    e->dev_mem[l] = dmem;
    for (size_t i = 0, off = 0; !e->region[l] && i < nb; off += ALIGN16(caps[i]), i++)
        e->dev_rows[l][i] = dmem + off;
    uint64_t *dsizes = (uint64_t *)(dmem + total);
    uint32_t *dfailed = (uint32_t *)(dmem + total + 8 * (size_t)nb);
    mf_extract_cuda_args_t ea = {
        .src = { a->q, a->k, NULL, MF_DTYPE_F16, a->n, a->n_heads, a->n_heads, a->head_dim },
        .lse = NULL, .block_size = e->block_size, .top_p = e->top_p, .codec = e->codec[l],
        .i0 = 0, .i1 = nb, .model = e->model, .ns = e->ns, .layer = l, .tokens = e->tokens,
        .rows = e->dev_rows[l], .caps = caps, .sizes = dsizes, .failed_block = dfailed };
    cudaStream_t s = (cudaStream_t)a->stream;
    double t0 = mf_now_s();
    st = mf_extract_cuda(&ea, a->stream, &e->why);
    if (st == MF_OK)
        st = cuda_st(cudaStreamSynchronize(s), &e->why);
    e->seconds += mf_now_s() - t0;
    if (st == MF_OK)
        st = cuda_st(cudaMemcpyAsync(sizes, dsizes, 8 * (size_t)nb, cudaMemcpyDeviceToHost, s), &e->why);
    if (st == MF_OK)
        st = cuda_st(cudaMemcpyAsync(&failed, dfailed, 4, cudaMemcpyDeviceToHost, s), &e->why);
    for (uint32_t i = 0; st == MF_OK && i < nb; i++) /* each row's n_entries, for the counts */
        st = cuda_st(cudaMemcpyAsync(entries + i, (uint8_t *)e->dev_rows[l][i] +
                                     offsetof(mf_row_header_t, n_entries), 4,
                                     cudaMemcpyDeviceToHost, s), &e->why);
    if (st == MF_OK)
        st = cuda_st(cudaStreamSynchronize(s), &e->why);
    if (st == MF_OK && failed != UINT32_MAX) { /* caps are upper bounds: cannot happen */
        e->why = "a row outgrew mf_extract_row_bound";
        st = MF_INTERNAL;
    }
    for (uint32_t i = 0; st == MF_OK && i < nb; i++) {
        e->sizes[l][i] = (size_t)sizes[i];
        e->entries += entries[i];
    }
    if (st == MF_OK && e->region[l] &&
        (st = mf_put_region_set_lengths(e->region[l], e->sizes[l], nb)) != MF_OK)
        e->why = mf_channel_last_error(e->region_ch);
out_host:
    free(caps);
    free(sizes);
    free(entries);
    return st;
}

mf_status_t mfw_extract_cuda_to_host(mfw_extract_t *e)
{
    mf_status_t st = MF_OK;
    for (uint32_t l = 0; l < MFW_MAX_LAYERS && st == MF_OK; l++) {
        if (!e->dev_rows[l])
            continue;
        if (!(e->rows[l] = calloc(e->n_blocks, sizeof(void *))))
            return MF_RESOURCE_EXHAUSTED;
        for (uint32_t i = 0; i < e->n_blocks && st == MF_OK; i++) {
            size_t n = e->sizes[l][i];
            if (!(e->rows[l][i] = aligned_alloc(16, ALIGN16(n ? n : 1))))
                return MF_RESOURCE_EXHAUSTED;
            st = cuda_st(cudaMemcpy(e->rows[l][i], e->dev_rows[l][i], n, cudaMemcpyDeviceToHost),
                         &e->why);
        }
        release_layer(e, l);
    }
    return st;
}

void mfw_reuse_cuda_release(mfw_reuse_t *r)
{
    for (uint32_t l = 0; l < MFW_MAX_LAYERS; l++) {
        free(r->dev_rows[l]);
        r->dev_rows[l] = NULL;
    }
    cudaFree(r->dev_mem);
    r->dev_mem = NULL;
}

mf_status_t mfw_reuse_cuda_upload(mfw_reuse_t *r)
{
    size_t total = 0;
    r->rows_on_device = r->rows_copied = 0;
    for (uint32_t l = 0; l < MFW_MAX_LAYERS; l++)
        for (uint32_t b = 0; r->rows[l] && b < r->n_rows; b++)
            if (!(r->dev_in[l] && r->dev_in[l][b]) && r->rows[l][b])
                total += ALIGN16(r->rows[l][b]->size);
    /* Gather the host rows into one buffer and copy once: they sit in the daemon's arena
     * (pageable shared memory) and one copy costs less than one per row. */
    uint8_t *host = total ? malloc(total) : NULL;
    mf_status_t st = MF_OK;
    if (total && !host)
        st = MF_RESOURCE_EXHAUSTED;
    else if (total)
        st = cuda_st(cudaMalloc(&r->dev_mem, total), &r->why);
    size_t off = 0;
    for (uint32_t l = 0; st == MF_OK && l < MFW_MAX_LAYERS; l++) {
        if (!r->rows[l])
            continue;
        if (!(r->dev_rows[l] = calloc(r->n_rows, sizeof(void *)))) {
            st = MF_RESOURCE_EXHAUSTED;
            break;
        }
        for (uint32_t b = 0; b < r->n_rows; b++) {
            const mf_row_view_t *v = r->rows[l][b];
            if (r->dev_in[l] && r->dev_in[l][b]) {
                r->dev_rows[l][b] = r->dev_in[l][b];
                r->rows_on_device++;
            } else if (v) {
                memcpy(host + off, v->base, v->size);
                r->dev_rows[l][b] = (uint8_t *)r->dev_mem + off;
                off += ALIGN16(v->size);
                r->rows_copied++;
            }
        }
    }
    /* cudaMemcpy from pageable memory may return before its DMA lands, and the run's
     * stream does not wait for the legacy stream: finish here. */
    if (st == MF_OK && total)
        st = cuda_st(cudaMemcpy(r->dev_mem, host, total, cudaMemcpyHostToDevice), &r->why);
    if (st == MF_OK && total)
        st = cuda_st(cudaDeviceSynchronize(), &r->why);
    free(host);
    if (st != MF_OK)
        mfw_reuse_cuda_release(r);
    return st;
}

mf_status_t mfw_reuse_cuda_hook(void *ctx, const mfw_cuda_attn_args_t *a)
{
    mfw_reuse_t *r = ctx;
    const Mapflow__V1__LayerMap *lm;
    uint8_t modes[64];
    float tops[64];
    mf_layer_map_t map;
    mf_status_t st = mfw_reuse_layer(r, a->layer, a->pos0, a->n_heads, &lm, &map, modes, tops);
    if (st != MF_OK || !lm)
        return st != MF_OK ? st : mfw_cuda_attention(a, &r->why);
    if (!r->dev_rows[lm->source_layer]) {
        r->why = "rows not on the device (mfw_reuse_cuda_upload)";
        return MF_FAILED_PRECONDITION;
    }
    const Mapflow__V1__RecomputePolicy *rp = r->profile->recompute;
    mf_apply_cuda_args_t aa = {
        .rows = r->dev_rows[lm->source_layer], .n_rows = r->n_rows, .map = &map,
        .tgt = { a->q, a->k, a->v, MF_DTYPE_F16, a->n, a->n_heads, a->n_heads, a->head_dim },
        .block_size = r->profile->block_size, .exact_first = rp ? rp->first_blocks : 0,
        .exact_last = rp ? rp->last_blocks : 0, .o = a->o };
    cudaStream_t s = (cudaStream_t)a->stream;
    /* synchronised on both sides so r->seconds is the kernel's own time */
    st = cuda_st(cudaStreamSynchronize(s), &r->why);
    double t0 = mf_now_s();
    if (st == MF_OK)
        st = mf_apply_cuda(&aa, a->stream, &r->why);
    if (st == MF_OK)
        st = cuda_st(cudaStreamSynchronize(s), &r->why);
    r->seconds += mf_now_s() - t0;
    r->layers_mapped += st == MF_OK;
    return st;
}
