/* store_evict — demotion and eviction: host rows down to the SSD tier (or dropped when it
 * holds them or is off), GPU rows down to host, the high / low watermark balance per tier
 * and arena, and mfd_store_evict (admin Evict / Flush). Pinned rows are never moved. See
 * store.h; loop thread only. */
#include "store.h"
#include "store_internal.h"
#include "log.h"

#include <stdlib.h>
#include <string.h>

/* ---- eviction ----------------------------------------------------------------------- */

/* Moves an unpinned host row down a tier; returns the host bytes freed. */
uint64_t mfd_store_demote(mfd_store_t *st, mfd_entry_t *e)
{
    uint64_t freed = mfd_ablock_size(e->host);
    mfd_count(st->metrics, MFD_C_EVICT_HOST, 1);
    if (e->gpu) { /* the GPU copy holds the row (a deferred write-through stays queued) */
        mfd_store_drop_host(st, e);
        return freed;
    }
    mfd_store_defer_remove(st, e); /* its write goes now, from the copy below */
    if (e->on_ssd) {
        mfd_store_drop_host(st, e);
        return freed;
    }
    uint8_t *copy = st->ssd ? malloc(e->size) : NULL;
    if (!copy) {
        mfd_store_remove(st, e);
        return freed;
    }
    /* Copy out so the arena block is free now; the write runs from the copy. */
    memcpy(copy, mfd_arena_base(st->arena) + mfd_ablock_offset(e->host), e->size);
    mfd_store_drop_host(st, e);
    e->wbuf = copy;
    if (!mfd_store_ssd_write(st, e, copy, 0, NULL, NULL, 0)) {
        mfd_store_remove(st, e);
        return freed;
    }
    mfd_count(st->metrics, MFD_C_DEMOTIONS, 1);
    return freed;
}

static int has_prefix(const mfd_entry_t *e, const uint8_t *prefix, size_t plen)
{
    return !plen || (e->key.len >= plen && memcmp(e->key.b, prefix, plen) == 0);
}

/* keep: an entry never demoted here (the row a commit just acknowledged). */
void mfd_store_evict_host(mfd_store_t *st, uint64_t want, const uint8_t *prefix, size_t plen,
                          const mfd_entry_t *keep, uint64_t *bytes, uint64_t *entries)
{
    uint64_t freed = 0, n = 0;
    mfd_entry_t *e = mfd_lru_coldest(st->ix, MFD_LRU_HOST);
    while (e && freed < want) {
        mfd_entry_t *next = mfd_lru_warmer(e, MFD_LRU_HOST);
        if (!e->pins && e->host && e != keep && has_prefix(e, prefix, plen)) {
            freed += mfd_store_demote(st, e);
            n++;
        }
        e = next;
    }
    if (bytes)
        *bytes += freed;
    if (entries)
        *entries += n;
}

/* Demotes down to the low watermark once over the high one, never `keep`. */
void mfd_store_balance(mfd_store_t *st, const mfd_entry_t *keep)
{
    uint64_t cap = mfd_arena_capacity(st->arena), used = mfd_arena_used(st->arena);
    if ((double)used <= st->cfg->high_watermark * (double)cap)
        return;
    uint64_t target = (uint64_t)(st->cfg->low_watermark * (double)cap);
    mfd_store_evict_host(st, used - target, NULL, 0, keep, NULL, NULL);
}

/* Moves an unpinned GPU row down: drops the GPU copy when another copy exists, else
 * copies it into a host block (DtoH), else (host arena full of pinned rows) straight to
 * the SSD tier. Returns the GPU bytes freed. */
static uint64_t demote_gpu(mfd_store_t *st, mfd_entry_t *e)
{
    uint64_t freed = mfd_ablock_size(e->gpu);
    mfd_count(st->metrics, MFD_C_EVICT_GPU, 1);
    if (e->host || e->on_ssd) {
        mfd_store_drop_gpu(st, e);
        return freed;
    }
    mfd_count(st->metrics, MFD_C_GPU_DEMOTIONS, 1);
    mfd_entry_pin(e); /* the host reservation below evicts only unpinned rows */
    mfd_ablock_t *hb;
    if (mfd_store_reserve(st, e->size, &hb) == MF_OK) {
        if (mfd_gpu_read(st->gpu, e->gpu_arena, e->gpu,
                         mfd_arena_base(st->arena) + mfd_ablock_offset(hb), e->size) != MF_OK) {
            mfd_arena_free(st->arena, hb);
            mfd_store_remove(st, e);
        } else {
            mfd_store_drop_gpu(st, e);
            e->host = hb;
            st->host_entries++;
            mfd_lru_add(st->ix, MFD_LRU_HOST, e);
        }
        mfd_index_unpin(st->ix, e);
        return freed;
    }
    /* No host room: the row goes to the SSD tier from a copy (or is dropped). */
    uint8_t *copy = st->ssd && !e->ssd_writing ? mfd_store_gpu_copy_out(st, e) : NULL;
    if (e->ssd_writing) { /* its write-through holds a copy and will land on the SSD */
        mfd_store_drop_gpu(st, e);
    } else if (!copy) {
        mfd_store_remove(st, e);
    } else {
        mfd_store_defer_remove(st, e);
        mfd_store_drop_gpu(st, e);
        free(e->wbuf);
        e->wbuf = copy;
        if (!mfd_store_ssd_write(st, e, copy, 0, NULL, NULL, 0))
            mfd_store_remove(st, e);
    }
    mfd_index_unpin(st->ix, e);
    return freed;
}

/* arena < 0: every arena. keep: never demoted (the row a commit just acknowledged). */
void mfd_store_evict_gpu(mfd_store_t *st, int arena, uint64_t want, const uint8_t *prefix,
                         size_t plen, const mfd_entry_t *keep, uint64_t *bytes, uint64_t *entries)
{
    uint64_t freed = 0, n = 0;
    mfd_entry_t *e = mfd_lru_coldest(st->ix, MFD_LRU_GPU);
    while (e && freed < want) {
        mfd_entry_t *next = mfd_lru_warmer(e, MFD_LRU_GPU);
        if (!e->pins && e->gpu && e != keep && (arena < 0 || e->gpu_arena == (uint32_t)arena) &&
            has_prefix(e, prefix, plen)) {
            freed += demote_gpu(st, e);
            n++;
        }
        e = next;
    }
    if (bytes)
        *bytes += freed;
    if (entries)
        *entries += n;
}

/* A GPU arena over its high watermark demotes down to the low one, never `keep`. */
void mfd_store_balance_gpu(mfd_store_t *st, uint32_t arena, const mfd_entry_t *keep)
{
    const mfd_gpu_arena_t *a = &st->gpu->a[arena];
    uint64_t cap = a->bytes, used = mfd_oalloc_used(a->alloc);
    if ((double)used <= st->cfg->high_watermark * (double)cap)
        return;
    uint64_t target = (uint64_t)(st->cfg->low_watermark * (double)cap), n = 0;
    mfd_store_evict_gpu(st, (int)arena, used - target, NULL, 0, keep, NULL, &n);
    if (n)
        mfd_store_balance(st, NULL); /* the demoted rows may have pushed the host over its mark */
}


void mfd_store_evict(mfd_store_t *st, int tier, uint64_t bytes, const uint8_t *prefix,
                     size_t plen, uint64_t *freed_bytes, uint64_t *freed_entries)
{
    *freed_bytes = *freed_entries = 0;
    if (tier == 1 && st->gpu) {
        uint64_t used = mfd_gpu_used(st->gpu);
        uint64_t low = (uint64_t)(st->cfg->low_watermark * (double)mfd_gpu_capacity(st->gpu));
        if (!bytes)
            bytes = used > low ? used - low : 0;
        mfd_store_evict_gpu(st, -1, bytes, prefix, plen, NULL, freed_bytes, freed_entries);
    } else if (tier == 2) { /* host */
        uint64_t used = mfd_arena_used(st->arena);
        uint64_t low = (uint64_t)(st->cfg->low_watermark * (double)mfd_arena_capacity(st->arena));
        if (!bytes)
            bytes = used > low ? used - low : 0;
        mfd_store_evict_host(st, bytes, prefix, plen, NULL, freed_bytes, freed_entries);
    } else if (tier == 3 && st->ssd) {
        uint64_t low = (uint64_t)(st->cfg->low_watermark * (double)st->cfg->ssd_bytes);
        if (!bytes)
            bytes = st->ssd_used > low ? st->ssd_used - low : 0;
        mfd_entry_t *e = mfd_lru_coldest(st->ix, MFD_LRU_SSD);
        while (e && *freed_bytes < bytes) {
            mfd_entry_t *next = mfd_lru_warmer(e, MFD_LRU_SSD);
            /* Durable rows stay until deleted: Evict is cache pressure, not removal. */
            if (!e->pins && !e->ssd_writing && e->on_ssd && !e->durable &&
                has_prefix(e, prefix, plen)) {
                *freed_bytes += e->size;
                (*freed_entries)++;
                mfd_count(st->metrics, MFD_C_EVICT_SSD, 1);
                if (e->host || e->gpu)
                    mfd_store_ssd_forget(st, e);
                else
                    mfd_store_remove(st, e);
            }
            e = next;
        }
    }
}
