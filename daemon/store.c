/* store — placement, write-through, demotion, promotion (see store.h). */
#include "store.h"
#include "ticket.h"
#include "log.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

/* A write in flight: who to tell when it is done. */
typedef struct write_ctx {
    mfd_store_t *st;
    mfd_entry_t *e;
    mfd_store_done_cb done;
    void *done_arg;
} write_ctx_t;

typedef struct read_ctx {
    mfd_store_t *st;
    mfd_entry_t *e;
    int promote;
    mfd_ablock_t *blk;         /* reserved for the promotion; the worker reads into it */
    mfd_store_read_cb cb;
    void *arg;
} read_ctx_t;

/* ---- deferred write-through (store.h) ------------------------------------------------- */

static uint64_t wt_limit(const mfd_store_t *st)
{
    return mfd_arena_capacity(st->arena) / 8;
}

static void defer_add(mfd_store_t *st, mfd_entry_t *e)
{
    e->wt_next = NULL;
    e->wt_prev = st->wt_tail;
    if (st->wt_tail)
        st->wt_tail->wt_next = e;
    else
        st->wt_head = e;
    st->wt_tail = e;
    e->wt_deferred = 1;
    st->wt_deferred_bytes += e->size;
}

static void defer_remove(mfd_store_t *st, mfd_entry_t *e)
{
    if (!e->wt_deferred)
        return;
    if (e->wt_prev)
        e->wt_prev->wt_next = e->wt_next;
    else
        st->wt_head = e->wt_next;
    if (e->wt_next)
        e->wt_next->wt_prev = e->wt_prev;
    else
        st->wt_tail = e->wt_prev;
    e->wt_prev = e->wt_next = NULL;
    e->wt_deferred = 0;
    st->wt_deferred_bytes -= e->size;
}

/* Releases e's GPU copy (block, head copy). Never touches the LRU: the index frees
 * entries still on their lists when it is destroyed. */
static void gpu_release(mfd_store_t *st, mfd_entry_t *e)
{
    mfd_gpu_free(st->gpu, e->gpu_arena, e->gpu);
    e->gpu = NULL;
    st->gpu_entries--;
    st->gpu->a[e->gpu_arena].entries--;
    free(e->ghead);
    e->ghead = NULL;
}

static void drop_gpu(mfd_store_t *st, mfd_entry_t *e)
{
    gpu_release(st, e);
    mfd_lru_remove(st->ix, MFD_LRU_GPU, e);
}

static void on_entry_free(mfd_entry_t *e, void *ctx)
{
    mfd_store_t *st = ctx;
    defer_remove(st, e);
    if (e->host) {
        mfd_arena_free(st->arena, e->host);
        e->host = NULL;
        st->host_entries--;
    }
    if (e->gpu)
        gpu_release(st, e);
    free(e->wbuf);
    e->wbuf = NULL;
}

static void on_scan(const uint8_t *key, size_t klen, uint64_t size, uint32_t block,
                    uint32_t flags, void *arg)
{
    mfd_store_t *st = arg;
    mfd_key_t k;
    k.len = (uint16_t)klen;
    memcpy(k.b, key, klen);
    mfd_entry_t *e = mfd_entry_new(&k);
    if (!e)
        return;
    mfd_key_parts_t parts;
    mfd_key_parse(key, klen, &parts);
    e->size = size;
    e->layer = parts.layer;
    e->block = block;
    e->on_ssd = 1;
    e->durable = (flags & 1u) != 0;
    mfd_index_insert(st->ix, e, NULL);
    mfd_lru_add(st->ix, MFD_LRU_SSD, e);
    st->ssd_used += size;
    st->ssd_entries++;
}

/* Opens the SSD tier and rebuilds the index from it; with ssd_reset, a database that
 * cannot be opened or scanned is moved aside once and an empty one used. */
static mf_status_t open_ssd(mfd_store_t *st, const mfd_config_t *cfg, char *err,
                            size_t errlen)
{
    mfd_ssd_options_t so = {cfg->data_dir, (unsigned)cfg->io_threads, cfg->ssd_reset};
    for (int attempt = 0;; attempt++) {
        mf_status_t s = mfd_ssd_open(&so, &st->ssd, err, errlen);
        if (s != MF_OK)
            return s;
        uint64_t t0 = mfd_now_ms();
        s = mfd_ssd_scan(st->ssd, on_scan, st, err, errlen);
        if (s == MF_OK) {
            mfd_info("ssd tier: %llu rows (%llu bytes) found in %s/rocksdb in %llu ms",
                     (unsigned long long)st->ssd_entries, (unsigned long long)st->ssd_used,
                     cfg->data_dir, (unsigned long long)(mfd_now_ms() - t0));
            return MF_OK;
        }
        /* The rows scanned so far go with the database. */
        mfd_ssd_close(st->ssd);
        st->ssd = NULL;
        mfd_index_destroy(st->ix);
        st->ix = NULL;
        st->ssd_used = st->ssd_entries = 0;
        mf_status_t s2 = mfd_index_create(on_entry_free, st, &st->ix);
        if (s2 != MF_OK)
            return s2;
        if (!cfg->ssd_reset || attempt) {
            size_t n = strlen(err);
            snprintf(err + n, errlen - n, " (--ssd_reset on moves the database aside)");
            return s;
        }
        mfd_warn("%s", err);
        if ((s = mfd_ssd_set_aside(cfg->data_dir, err, errlen)) != MF_OK)
            return s;
    }
}

mf_status_t mfd_store_open(mfd_store_t *st, const mfd_config_t *cfg, mfd_metrics_t *m,
                           char *err, size_t errlen)
{
    memset(st, 0, sizeof(*st));
    st->cfg = cfg;
    st->metrics = m;
    mf_status_t s = mfd_index_create(on_entry_free, st, &st->ix);
    if (s != MF_OK)
        return s;
    s = mfd_arena_create(cfg->host_bytes, &st->arena);
    if (s != MF_OK) {
        snprintf(err, errlen, "cannot create the host arena of %llu bytes",
                 (unsigned long long)cfg->host_bytes);
        goto fail;
    }
    s = mfd_gpu_open(cfg->gpu_bytes, cfg->gpu_devices, &st->gpu, st->gpu_why,
                     sizeof(st->gpu_why));
    if (s == MF_INVALID_ARGUMENT) {
        snprintf(err, errlen, "%s", st->gpu_why);
        goto fail;
    }
    s = MF_OK; /* anything else leaves the tier off, with its why */
    if (st->gpu && cfg->host_pin)
        mfd_gpu_pin_host(st->gpu, mfd_arena_base(st->arena), mfd_arena_capacity(st->arena));
    else if (st->gpu)
        mfd_info("host arena: not pinned for CUDA (host_pin off): GPU<->host tier copies "
                 "are pageable");
    if (cfg->ssd_bytes > 0 && (s = open_ssd(st, cfg, err, errlen)) != MF_OK)
        goto fail;
    return MF_OK;

fail:
    /* One teardown for every partial state; it clears st, so a later mfd_store_close (the
     * server's destroy) finds nothing to free twice. */
    mfd_store_close(st);
    return s;
}

mf_status_t mfd_store_attach(mfd_store_t *st, struct event_base *base)
{
    return st->ssd ? mfd_ssd_attach(st->ssd, base) : MF_OK;
}

static void wt_pump(mfd_store_t *st, int all);

void mfd_store_drain(mfd_store_t *st)
{
    if (!st->ssd)
        return;
    wt_pump(st, 1);
    mfd_ssd_drain(st->ssd);
}

void mfd_store_close(mfd_store_t *st)
{
    if (st->ssd && st->ix)
        mfd_store_drain(st);
    /* Entries go before the arena: their free callback returns blocks to it. */
    mfd_index_destroy(st->ix);
    if (st->ssd)
        mfd_ssd_close(st->ssd);
    mfd_gpu_close(st->gpu);
    mfd_arena_destroy(st->arena);
    memset(st, 0, sizeof(*st));
}

/* ---- SSD writes --------------------------------------------------------------------- */

static void drop_host(mfd_store_t *st, mfd_entry_t *e)
{
    mfd_arena_free(st->arena, e->host);
    e->host = NULL;
    st->host_entries--;
    mfd_lru_remove(st->ix, MFD_LRU_HOST, e);
}

/* A 64-aligned host buffer with a GPU row's bytes (DtoH), or NULL. */
static uint8_t *gpu_copy_out(mfd_store_t *st, const mfd_entry_t *e)
{
    uint8_t *b = aligned_alloc(64, mfd_arena_round(e->size));
    if (b && mfd_gpu_read(st->gpu, e->gpu_arena, e->gpu, b, e->size) != MF_OK) {
        free(b);
        b = NULL;
    }
    return b;
}

/* Drops e's SSD record (queued write included) from the accounting and deletes it. */
static void ssd_forget(mfd_store_t *st, mfd_entry_t *e)
{
    mfd_ssd_job_t *j = mfd_ssd_job_new(MFD_SSD_DEL_ROW, e->key.b, e->key.len);
    if (j)
        mfd_ssd_submit(st->ssd, j);
    st->ssd_used -= e->size;
    st->ssd_entries--;
    e->on_ssd = 0;
    mfd_lru_remove(st->ix, MFD_LRU_SSD, e);
}

/* Makes `size` bytes of room in the SSD budget by dropping cold unpinned SSD copies.
 * Durable rows are never dropped: "durable" means kept until deleted (a durable put that
 * does not fit is refused instead, durable_room). */
static int ssd_room(mfd_store_t *st, uint64_t size)
{
    uint64_t budget = st->cfg->ssd_bytes;
    if (size > budget)
        return 0;
    mfd_entry_t *e = mfd_lru_coldest(st->ix, MFD_LRU_SSD);
    while (st->ssd_used + size > budget && e) {
        mfd_entry_t *next = mfd_lru_warmer(e, MFD_LRU_SSD);
        if (!e->pins && !e->ssd_writing && e->on_ssd && !e->durable) {
            mfd_count(st->metrics, MFD_C_EVICT_SSD, 1);
            if (e->host || e->gpu)
                ssd_forget(st, e);       /* the memory copy stays */
            else
                mfd_store_remove(st, e); /* no copy left anywhere */
        }
        e = next;
    }
    return st->ssd_used + size <= budget;
}

/* A durable put of `size` bytes under key fits the SSD budget (dropping non-durable SSD
 * copies as needed; the SSD record of the row it replaces counts as free). 0: refuse it
 * (RESOURCE_EXHAUSTED, counted), never evict acknowledged durable rows for it. */
static int durable_room(mfd_store_t *st, const mfd_key_t *key, uint64_t size, const char **why)
{
    if (!st->ssd)
        return 1;
    const mfd_entry_t *old = mfd_index_find(st->ix, key->b, key->len);
    uint64_t credit = old && (old->on_ssd || old->ssd_writing) ? old->size : 0;
    if (ssd_room(st, size > credit ? size - credit : 0))
        return 1;
    mfd_count(st->metrics, MFD_C_SSD_FULL, 1);
    *why = "the SSD budget (ssd_bytes) is full of durable rows: delete rows, raise ssd_bytes, "
           "or put without durable";
    return 0;
}

static void on_write_done(mfd_ssd_job_t *j)
{
    write_ctx_t *w = j->arg;
    mfd_store_t *st = w->st;
    mfd_entry_t *e = w->e;
    int ok = j->status == MF_OK;
    e->ssd_writing = 0;
    e->wjob = NULL;
    if (e->wt_arena) {
        e->wt_arena = 0;
        st->wt_bytes -= e->size;
    }
    free(e->wbuf);
    e->wbuf = NULL;
    mfd_count(st->metrics, ok ? MFD_C_SSD_WRITES_DONE : MFD_C_SSD_ERRORS, 1);
    if (e->linked) {
        if (ok) {
            e->on_ssd = 1;
            e->durable = j->sync != 0;
        } else {
            st->ssd_used -= e->size;
            st->ssd_entries--;
            mfd_lru_remove(st->ix, MFD_LRU_SSD, e);
            if (!e->host && !e->gpu) /* a failed demotion: the bytes are gone */
                mfd_index_unlink(st->ix, e);
        }
    }
    if (w->done)
        w->done(w->done_arg, ok ? MF_OK : j->status, ok && j->sync);
    free(w);
    mfd_ssd_job_free(j);
    mfd_index_unpin(st->ix, e);
    wt_pump(st, 0);
}

/* Queues a write of e's bytes; 0 when the SSD tier is off, full or out of memory.
 * wt: an async write-through straight from the host block (counted in wt_bytes and
 * cancellable until a worker starts it). */
static int ssd_write(mfd_store_t *st, mfd_entry_t *e, const uint8_t *bytes, int sync,
                     mfd_store_done_cb done, void *done_arg, int wt)
{
    if (!st->ssd || !ssd_room(st, e->size))
        return 0;
    write_ctx_t *w = calloc(1, sizeof(*w));
    mfd_ssd_job_t *j = mfd_ssd_job_new(MFD_SSD_PUT_ROW, e->key.b, e->key.len);
    if (!w || !j) {
        free(w);
        mfd_ssd_job_free(j);
        return 0;
    }
    *w = (write_ctx_t){st, e, done, done_arg};
    j->value = bytes;
    j->vlen = e->size;
    j->block = e->block;
    j->sync = sync;
    j->cb = on_write_done;
    j->arg = w;
    mfd_entry_pin(e);
    e->ssd_writing = 1;
    e->wjob = j;
    if (wt) {
        e->wt_arena = 1;
        st->wt_bytes += e->size;
    }
    st->ssd_used += e->size;
    st->ssd_entries++;
    mfd_lru_add(st->ix, MFD_LRU_SSD, e);
    mfd_count(st->metrics, MFD_C_SSD_WRITES, 1);
    mfd_count(st->metrics, MFD_C_SSD_WRITE_BYTES, e->size);
    mfd_ssd_submit(st->ssd, j);
    return 1;
}

/* Takes back e's async write-through if no worker started it (the row was replaced or
 * removed first): 1 when cancelled, i.e. nothing of it reached the SSD tier. e must
 * still be linked (the write's pin is dropped here). */
static int cancel_write(mfd_store_t *st, mfd_entry_t *e)
{
    if (!e->ssd_writing || !e->wt_arena || !e->wjob || !mfd_ssd_cancel(st->ssd, e->wjob))
        return 0;
    mfd_ssd_job_t *j = e->wjob;
    free(j->arg); /* write_ctx_t; async writes have no done callback */
    mfd_ssd_job_free(j);
    e->wjob = NULL;
    e->ssd_writing = 0;
    e->wt_arena = 0;
    st->wt_bytes -= e->size;
    st->ssd_used -= e->size;
    st->ssd_entries--;
    mfd_lru_remove(st->ix, MFD_LRU_SSD, e);
    mfd_count(st->metrics, MFD_C_SSD_WRITES_CANCELLED, 1);
    mfd_index_unpin(st->ix, e);
    return 1;
}

/* Starts the async write-through of a row in memory: from its host block, else (a GPU row)
 * from a DtoH copy held in wbuf until the write completes. Counted in wt_bytes either way,
 * so GPU rows' copies are bounded like the host blocks pinned for writing. */
static void wt_write(mfd_store_t *st, mfd_entry_t *e)
{
    const uint8_t *b = mfd_store_bytes(st, e); /* host block, or a copy already made */
    if (!b && e->gpu)
        b = e->wbuf = gpu_copy_out(st, e);
    if (b && !ssd_write(st, e, b, 0, NULL, NULL, 1) && !e->host) {
        free(e->wbuf);
        e->wbuf = NULL;
    }
}

/* Async write-through of a host row: now when the backlog allows, else deferred. */
static void wt_start(mfd_store_t *st, mfd_entry_t *e)
{
    if (!st->ssd)
        return;
    if (st->wt_head || (st->wt_bytes && st->wt_bytes + e->size > wt_limit(st))) {
        defer_add(st, e);
        return;
    }
    wt_write(st, e);
}

/* Starts deferred write-throughs while the backlog has room (all: every one). A row
 * that left the host tier, reached the SSD otherwise or lost write_through is dropped
 * from the list. */
static void wt_pump(mfd_store_t *st, int all)
{
    if (st->wt_pumping)
        return;
    st->wt_pumping = 1;
    while (st->wt_head &&
           (all || !st->wt_bytes || st->wt_bytes + st->wt_head->size <= wt_limit(st))) {
        mfd_entry_t *e = st->wt_head;
        defer_remove(st, e);
        if (e->linked && (e->host || e->gpu) && !e->on_ssd && !e->ssd_writing &&
            st->cfg->write_through != MFD_WT_OFF)
            wt_write(st, e);
    }
    st->wt_pumping = 0;
}

/* ---- eviction ----------------------------------------------------------------------- */

/* Moves an unpinned host row down a tier; returns the host bytes freed. */
static uint64_t demote(mfd_store_t *st, mfd_entry_t *e)
{
    uint64_t freed = mfd_ablock_size(e->host);
    mfd_count(st->metrics, MFD_C_EVICT_HOST, 1);
    if (e->gpu) { /* the GPU copy holds the row (a deferred write-through stays queued) */
        drop_host(st, e);
        return freed;
    }
    defer_remove(st, e); /* its write goes now, from the copy below */
    if (e->on_ssd) {
        drop_host(st, e);
        return freed;
    }
    uint8_t *copy = st->ssd ? malloc(e->size) : NULL;
    if (!copy) {
        mfd_store_remove(st, e);
        return freed;
    }
    /* Copy out so the arena block is free now; the write runs from the copy. */
    memcpy(copy, mfd_arena_base(st->arena) + mfd_ablock_offset(e->host), e->size);
    drop_host(st, e);
    e->wbuf = copy;
    if (!ssd_write(st, e, copy, 0, NULL, NULL, 0)) {
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
static void evict_host(mfd_store_t *st, uint64_t want, const uint8_t *prefix, size_t plen,
                       const mfd_entry_t *keep, uint64_t *bytes, uint64_t *entries)
{
    uint64_t freed = 0, n = 0;
    mfd_entry_t *e = mfd_lru_coldest(st->ix, MFD_LRU_HOST);
    while (e && freed < want) {
        mfd_entry_t *next = mfd_lru_warmer(e, MFD_LRU_HOST);
        if (!e->pins && e->host && e != keep && has_prefix(e, prefix, plen)) {
            freed += demote(st, e);
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
static void balance(mfd_store_t *st, const mfd_entry_t *keep)
{
    uint64_t cap = mfd_arena_capacity(st->arena), used = mfd_arena_used(st->arena);
    if ((double)used <= st->cfg->high_watermark * (double)cap)
        return;
    uint64_t target = (uint64_t)(st->cfg->low_watermark * (double)cap);
    evict_host(st, used - target, NULL, 0, keep, NULL, NULL);
}

/* Moves an unpinned GPU row down: drops the GPU copy when another copy exists, else
 * copies it into a host block (DtoH), else (host arena full of pinned rows) straight to
 * the SSD tier. Returns the GPU bytes freed. */
static uint64_t demote_gpu(mfd_store_t *st, mfd_entry_t *e)
{
    uint64_t freed = mfd_ablock_size(e->gpu);
    mfd_count(st->metrics, MFD_C_EVICT_GPU, 1);
    if (e->host || e->on_ssd) {
        drop_gpu(st, e);
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
            drop_gpu(st, e);
            e->host = hb;
            st->host_entries++;
            mfd_lru_add(st->ix, MFD_LRU_HOST, e);
        }
        mfd_index_unpin(st->ix, e);
        return freed;
    }
    /* No host room: the row goes to the SSD tier from a copy (or is dropped). */
    uint8_t *copy = st->ssd && !e->ssd_writing ? gpu_copy_out(st, e) : NULL;
    if (e->ssd_writing) { /* its write-through holds a copy and will land on the SSD */
        drop_gpu(st, e);
    } else if (!copy) {
        mfd_store_remove(st, e);
    } else {
        defer_remove(st, e);
        drop_gpu(st, e);
        free(e->wbuf);
        e->wbuf = copy;
        if (!ssd_write(st, e, copy, 0, NULL, NULL, 0))
            mfd_store_remove(st, e);
    }
    mfd_index_unpin(st->ix, e);
    return freed;
}

/* arena < 0: every arena. keep: never demoted (the row a commit just acknowledged). */
static void evict_gpu(mfd_store_t *st, int arena, uint64_t want, const uint8_t *prefix,
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
static void balance_gpu(mfd_store_t *st, uint32_t arena, const mfd_entry_t *keep)
{
    const mfd_gpu_arena_t *a = &st->gpu->a[arena];
    uint64_t cap = a->bytes, used = mfd_oalloc_used(a->alloc);
    if ((double)used <= st->cfg->high_watermark * (double)cap)
        return;
    uint64_t target = (uint64_t)(st->cfg->low_watermark * (double)cap), n = 0;
    evict_gpu(st, (int)arena, used - target, NULL, 0, keep, NULL, &n);
    if (n)
        balance(st, NULL); /* the demoted rows may have pushed the host over its mark */
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
        evict_gpu(st, -1, bytes, prefix, plen, NULL, freed_bytes, freed_entries);
    } else if (tier == 2) { /* host */
        uint64_t used = mfd_arena_used(st->arena);
        uint64_t low = (uint64_t)(st->cfg->low_watermark * (double)mfd_arena_capacity(st->arena));
        if (!bytes)
            bytes = used > low ? used - low : 0;
        evict_host(st, bytes, prefix, plen, NULL, freed_bytes, freed_entries);
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
                    ssd_forget(st, e);
                else
                    mfd_store_remove(st, e);
            }
            e = next;
        }
    }
}

mf_status_t mfd_store_reserve(mfd_store_t *st, uint64_t size, mfd_ablock_t **blk)
{
    mf_status_t s = mfd_arena_alloc(st->arena, size, blk);
    if (s != MF_RESOURCE_EXHAUSTED)
        return s;
    /* Free at least the size plus the watermark gap, so puts do not evict one by one. */
    uint64_t cap = mfd_arena_capacity(st->arena);
    uint64_t gap = (uint64_t)((st->cfg->high_watermark - st->cfg->low_watermark) * (double)cap);
    evict_host(st, mfd_arena_round(size) + gap, NULL, 0, NULL, NULL, NULL);
    return mfd_arena_alloc(st->arena, size, blk);
}

void mfd_store_unreserve(mfd_store_t *st, mfd_ablock_t *blk)
{
    mfd_arena_free(st->arena, blk);
}

mf_status_t mfd_store_reserve_gpu(mfd_store_t *st, uint64_t size, int pref, uint32_t *arena,
                                  mfd_ablock_t **blk)
{
    mfd_gpu_t *g = st->gpu;
    if (!g)
        return MF_UNAVAILABLE;
    uint32_t first = 0;
    if (pref >= 0 && (size_t)pref < g->n) {
        first = (uint32_t)pref;
    } else {
        uint64_t best = 0;
        for (uint32_t i = 0; i < g->n; i++) {
            uint64_t f = mfd_oalloc_largest_free(g->a[i].alloc);
            if (f > best) {
                best = f;
                first = i;
            }
        }
    }
    mf_status_t s = mfd_gpu_alloc(g, first, size, blk);
    if (s == MF_RESOURCE_EXHAUSTED && size <= g->a[first].bytes) {
        /* Free the size plus the watermark gap, so puts do not demote one by one. */
        uint64_t gap = (uint64_t)((st->cfg->high_watermark - st->cfg->low_watermark) *
                                  (double)g->a[first].bytes);
        evict_gpu(st, (int)first, mfd_arena_round(size) + gap, NULL, 0, NULL, NULL, NULL);
        s = mfd_gpu_alloc(g, first, size, blk);
    }
    for (uint32_t i = 0; s == MF_RESOURCE_EXHAUSTED && i < g->n; i++)
        if (i != first && (s = mfd_gpu_alloc(g, i, size, blk)) == MF_OK)
            first = i;
    if (s == MF_OK)
        *arena = first;
    return s;
}

void mfd_store_unreserve_gpu(mfd_store_t *st, uint32_t arena, mfd_ablock_t *blk)
{
    mfd_gpu_free(st->gpu, arena, blk);
}

/* ---- rows ------------------------------------------------------------------------- */

/* Marks e's layer in its block index node from a row validated in full just now. */
static void note_row(mfd_store_t *st, mfd_entry_t *e, const uint8_t *row, size_t len)
{
    mf_row_view_t v;
    const char *why;
    if (mf_row_peek(row, len, &v, &why) != MF_OK)
        return;
    uint8_t parent[16];
    mf_hash_to_le(v.parent, parent);
    mfd_index_block_note(st->ix, e, v.block_size, parent, v.tokens);
}

mf_status_t mfd_row_verify(const uint8_t *row, size_t len, int full_checksum,
                           const uint32_t *tokens, uint32_t block_size,
                           mf_hash128_t parent, mf_hash128_t hash, const char **why)
{
    /* Without the checksum: the hit check of a row validated at commit, its header read
     * once (a client may be writing the arena), nothing read past len. */
    mf_row_view_t v;
    mf_status_t s = full_checksum ? mf_row_decode(row, len, 0, &v, why)
                                  : mf_row_peek(row, len, &v, why);
    if (s != MF_OK)
        return MF_DATA_LOSS;
    if (!tokens)
        return MF_OK;
    mf_row_want_t w = {.fields = MF_MATCH_TOKENS | MF_MATCH_PARENT | MF_MATCH_HASH,
                       .block_size = block_size, .parent = parent, .hash = hash,
                       .tokens = tokens};
    /* Another context under the same key (a hash collision): not this map. */
    return mf_row_match(&v, &w, why) ? MF_OK : MF_NOT_FOUND;
}

/* The decoded row must be the one its key names. */
static mf_status_t check_key(const mf_row_view_t *v, const mfd_key_t *key, const char **why)
{
    mfd_key_parts_t p;
    if (mfd_key_parse(key->b, key->len, &p) != MF_OK) {
        *why = "malformed key";
        return MF_INVALID_ARGUMENT;
    }
    uint8_t h[16];
    mf_hash_to_le(v->hash, h);
    if (v->model_len != p.model_len || memcmp(v->model, p.model, p.model_len) != 0) {
        *why = "row model differs from the key's model";
        return MF_INVALID_ARGUMENT;
    }
    if (v->layer != p.layer) {
        *why = "row layer differs from the key's layer";
        return MF_INVALID_ARGUMENT;
    }
    if (memcmp(h, p.hash, 16) != 0) {
        *why = "row hash differs from the key's hash";
        return MF_INVALID_ARGUMENT;
    }
    /* The hash must be the chain's (DESIGN §4): a row can only sit under the key its own
     * parent and tokens name, so a hit that matches tokens and parent matches the key, and
     * block 0 hangs off this (block size, namespace, model)'s root. */
    if (!mf_hash_eq(v->hash, mf_hash_next(v->parent, v->tokens, v->block_size))) {
        *why = "row hash is not H(parent, tokens)";
        return MF_INVALID_ARGUMENT;
    }
    if (v->block_index == 0 &&
        !mf_hash_eq(v->parent, mf_hash_root(v->block_size, p.ns, p.ns_len, p.model,
                                            p.model_len))) {
        *why = "block 0's parent is not the root hash of its namespace and model";
        return MF_INVALID_ARGUMENT;
    }
    return MF_OK;
}

/* A host copy of a validated row's head: header, model and its block's tokens (what the
 * hit check reads), 64-aligned. */
static uint8_t *head_copy(const uint8_t *row, size_t size)
{
    const mf_row_header_t *h = (const mf_row_header_t *)row;
    size_t toff = (MF_ROW_HEADER + (size_t)h->model_len + MF_ROW_ALIGN - 1) &
                  ~(size_t)(MF_ROW_ALIGN - 1);
    size_t n = toff + (size_t)h->block_size * sizeof(uint32_t);
    if (n > size)
        n = size;
    uint8_t *c = aligned_alloc(64, mfd_arena_round(n));
    if (c)
        memcpy(c, row, n);
    return c;
}

/* Validates a row (full decode + checksum, key agreement); counts a rejection. */
static mf_status_t validate_flags(mfd_store_t *st, const mfd_key_t *key, const uint8_t *row,
                                  uint64_t size, unsigned flags, mf_row_view_t *v,
                                  const char **why)
{
    mf_status_t s = mf_row_decode(row, size, flags, v, why);
    if (s == MF_OK)
        s = check_key(v, key, why);
    if (s != MF_OK)
        mfd_count(st->metrics, MFD_C_PUT_REJECTED, 1);
    return s == MF_UNIMPLEMENTED ? MF_INVALID_ARGUMENT : s;
}

static mf_status_t validate(mfd_store_t *st, const mfd_key_t *key, const uint8_t *row,
                            uint64_t size, mf_row_view_t *v, const char **why)
{
    return validate_flags(st, key, row, size, 0, v, why);
}

/* Makes e (its tier fields set) visible under key, replacing any old entry. */
static void link_entry(mfd_store_t *st, const mfd_key_t *key, mfd_entry_t *e,
                       const mf_row_view_t *v, uint64_t size, int *replaced)
{
    e->size = size;
    e->layer = v->layer;
    e->block = v->block_index;
    e->last_access_ms = mfd_now_ms();
    mfd_entry_t *old = mfd_index_find(st->ix, key->b, key->len);
    if (old) {
        /* Its queued write-through is cancelled (never written over the new row's). */
        *replaced = 1;
        mfd_count(st->metrics, MFD_C_PUT_REPLACED, 1);
        mfd_store_remove(st, old);
    }
    mfd_index_insert(st->ix, e, NULL);
    uint8_t parent[16];
    mf_hash_to_le(v->parent, parent);
    mfd_index_block_note(st->ix, e, v->block_size, parent, v->tokens);
    mfd_count(st->metrics, MFD_C_PUTS, 1);
    mfd_count(st->metrics, MFD_C_PUT_BYTES, size);
}

mf_status_t mfd_store_commit(mfd_store_t *st, const mfd_key_t *key, mfd_ablock_t *blk,
                             uint64_t size, int durable, mfd_store_done_cb done, void *arg,
                             int *pending, int *is_durable, int *replaced, const char **why)
{
    *pending = *is_durable = *replaced = 0;
    const uint8_t *row = mfd_arena_base(st->arena) + mfd_ablock_offset(blk);
    mf_row_view_t v;
    mf_status_t s = validate(st, key, row, size, &v, why);
    if (s == MF_OK && durable && !durable_room(st, key, size, why))
        s = MF_RESOURCE_EXHAUSTED;
    mfd_entry_t *e = s == MF_OK ? mfd_entry_new(key) : NULL;
    if (s == MF_OK && !e) {
        *why = "out of memory";
        s = MF_RESOURCE_EXHAUSTED;
    }
    if (s != MF_OK) {
        mfd_arena_free(st->arena, blk);
        return s;
    }
    e->host = blk;
    st->host_entries++;
    link_entry(st, key, e, &v, size, replaced);
    mfd_lru_add(st->ix, MFD_LRU_HOST, e);

    int wt = st->cfg->write_through;
    int want_sync = durable || wt == MFD_WT_SYNC;
    if (want_sync)
        *pending = ssd_write(st, e, row, 1, done, arg, 0);
    else if (wt == MFD_WT_ASYNC)
        wt_start(st, e);
    /* Never the row just made visible: it is acknowledged, so it stays until later
     * pressure demotes it like any other row. */
    balance(st, e);
    return MF_OK;
}

/* Monotonic microseconds (commit phase counters). */
static uint64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

mf_status_t mfd_store_commit_gpu(mfd_store_t *st, const mfd_key_t *key, uint32_t arena,
                                 mfd_ablock_t *blk, uint64_t size, int durable,
                                 mfd_store_done_cb done, void *arg, int *pending,
                                 int *is_durable, int *replaced, const char **why)
{
    *pending = *is_durable = *replaced = 0;
    /* The daemon never reads device memory in place: the checksum runs on the GPU (or the
     * row is copied whole into the tier's staging buffer) and the decoder checks the host
     * bytes (tier_gpu.h, mfd_gpu_check_row). */
    const uint8_t *stg = NULL;
    size_t have = 0;
    uint64_t sum = 0;
    int on_gpu = 0;
    mf_row_view_t v;
    uint64_t t0 = now_us();
    mf_status_t s = mfd_gpu_check_row(st->gpu, arena, blk, size, &stg, &have, &sum, &on_gpu);
    uint64_t t1 = now_us();
    mfd_count(st->metrics, MFD_C_GPU_COMMIT_CHECK_US, t1 - t0);
    *why = "cannot copy the row out of the GPU arena";
    if (s == MF_OK) {
        /* The decoder reads a row's bytes before its tiles only (prefix) once the checksum
         * is skipped, and a row it would refuse from its header came with those bytes. */
        s = validate_flags(st, key, stg, size, on_gpu ? MF_ROW_NO_CHECKSUM : 0, &v, why);
        if (s == MF_OK && on_gpu && ((const mf_row_header_t *)stg)->checksum != sum) {
            mfd_count(st->metrics, MFD_C_PUT_REJECTED, 1);
            *why = "checksum mismatch (computed on the GPU)";
            s = MF_DATA_LOSS;
        }
        if (s == MF_OK)
            mfd_count(st->metrics, on_gpu ? MFD_C_GPU_VERIFY_GPU : MFD_C_GPU_VERIFY_HOST, 1);
    }
    (void)have;
    if (s == MF_OK && durable && !durable_room(st, key, size, why))
        s = MF_RESOURCE_EXHAUSTED;
    mfd_entry_t *e = s == MF_OK ? mfd_entry_new(key) : NULL;
    uint8_t *head = e ? head_copy(stg, size) : NULL;
    if (s == MF_OK && (!e || !head)) {
        *why = "out of memory";
        s = MF_RESOURCE_EXHAUSTED;
        if (e)
            mfd_index_discard(st->ix, e);
    }
    if (s != MF_OK) {
        free(head);
        mfd_gpu_free(st->gpu, arena, blk);
        return s;
    }
    e->gpu = blk;
    e->gpu_arena = arena;
    e->ghead = head;
    st->gpu_entries++;
    st->gpu->a[arena].entries++;
    link_entry(st, key, e, &v, size, replaced);
    mfd_lru_add(st->ix, MFD_LRU_GPU, e);

    /* Write-through needs the whole row on the host: a copy of the staging bytes when the
     * row was validated there, else a DtoH (the entry's wbuf until the write is done). */
    int wt = st->cfg->write_through;
    int want_wt = durable || wt == MFD_WT_SYNC || (wt == MFD_WT_ASYNC && st->ssd);
    uint8_t *copy = NULL;
    if (want_wt && !(wt == MFD_WT_ASYNC && !durable &&
                     (st->wt_head || (st->wt_bytes && st->wt_bytes + size > wt_limit(st))))) {
        if (have == size && (copy = aligned_alloc(64, mfd_arena_round(size))))
            memcpy(copy, stg, size);
        else
            copy = gpu_copy_out(st, e);
    }
    if (durable || wt == MFD_WT_SYNC) {
        e->wbuf = copy;
        *pending = copy ? ssd_write(st, e, e->wbuf, 1, done, arg, 0) : 0;
        if (!*pending) {
            free(e->wbuf);
            e->wbuf = NULL;
        }
    } else if (wt == MFD_WT_ASYNC && st->ssd) {
        if (!copy) {
            defer_add(st, e); /* copied out again when its turn comes */
        } else {
            e->wbuf = copy;
            wt_write(st, e);
        }
    }
    balance_gpu(st, arena, e);
    mfd_count(st->metrics, MFD_C_GPU_COMMIT_US, now_us() - t0);
    return MF_OK;
}

mfd_entry_t *mfd_store_find(mfd_store_t *st, const mfd_key_t *key)
{
    return mfd_index_find(st->ix, key->b, key->len);
}

const uint8_t *mfd_store_bytes(const mfd_store_t *st, const mfd_entry_t *e)
{
    if (e->host)
        return mfd_arena_base(st->arena) + mfd_ablock_offset(e->host);
    return e->wbuf;
}

const uint8_t *mfd_store_head(const mfd_store_t *st, const mfd_entry_t *e)
{
    const uint8_t *b = mfd_store_bytes(st, e);
    return b ? b : e->ghead;
}

mf_status_t mfd_store_gpu_read(mfd_store_t *st, const mfd_entry_t *e, uint8_t *dst)
{
    return e->gpu ? mfd_gpu_read(st->gpu, e->gpu_arena, e->gpu, dst, e->size) : MF_NOT_FOUND;
}

mf_status_t mfd_store_stage_host(mfd_store_t *st, mfd_entry_t *e)
{
    if (e->host)
        return MF_OK;
    if (!e->gpu)
        return MF_NOT_FOUND;
    mfd_ablock_t *hb;
    mf_status_t s = mfd_store_reserve(st, e->size, &hb);
    if (s != MF_OK)
        return s;
    s = mfd_gpu_read(st->gpu, e->gpu_arena, e->gpu,
                     mfd_arena_base(st->arena) + mfd_ablock_offset(hb), e->size);
    if (s != MF_OK) {
        mfd_arena_free(st->arena, hb);
        return s;
    }
    e->host = hb;
    st->host_entries++;
    mfd_lru_add(st->ix, MFD_LRU_HOST, e);
    mfd_count(st->metrics, MFD_C_GPU_STAGED, 1);
    return MF_OK;
}

void mfd_store_promote_gpu(mfd_store_t *st, mfd_entry_t *e)
{
    if (!st->gpu || !st->cfg->gpu_promote || e->gpu || !e->host || !e->linked)
        return;
    const uint8_t *row = mfd_store_bytes(st, e);
    uint32_t arena;
    mfd_ablock_t *blk;
    uint8_t *head = head_copy(row, e->size);
    if (!head || mfd_store_reserve_gpu(st, e->size, -1, &arena, &blk) != MF_OK) {
        free(head);
        return;
    }
    if (mfd_gpu_write(st->gpu, arena, blk, row, e->size) != MF_OK) {
        mfd_gpu_free(st->gpu, arena, blk);
        free(head);
        return;
    }
    e->gpu = blk;
    e->gpu_arena = arena;
    e->ghead = head;
    st->gpu_entries++;
    st->gpu->a[arena].entries++;
    mfd_lru_add(st->ix, MFD_LRU_GPU, e);
    mfd_count(st->metrics, MFD_C_GPU_PROMOTIONS, 1);
}

void mfd_store_touch(mfd_store_t *st, mfd_entry_t *e)
{
    e->last_access_ms = mfd_now_ms();
    if (e->gpu)
        mfd_lru_touch(st->ix, MFD_LRU_GPU, e);
    if (e->host)
        mfd_lru_touch(st->ix, MFD_LRU_HOST, e);
    if (e->on_ssd)
        mfd_lru_touch(st->ix, MFD_LRU_SSD, e);
}

void mfd_store_remove(mfd_store_t *st, mfd_entry_t *e)
{
    if (!e->linked)
        return;
    defer_remove(st, e);
    int cancelled = cancel_write(st, e);
    if (e->on_ssd || e->ssd_writing)
        ssd_forget(st, e);
    mfd_index_unlink(st->ix, e);
    if (cancelled)
        wt_pump(st, 0);
}

/* ---- SSD reads ---------------------------------------------------------------------- */

/* Worker thread: the full validation of a row read back (checksum, key agreement). */
static mf_status_t check_read(const uint8_t *row, size_t len, const mfd_ssd_job_t *j,
                              const char **why)
{
    mf_row_view_t v;
    mfd_key_t k;
    k.len = (uint16_t)j->klen;
    memcpy(k.b, j->key, j->klen);
    mf_status_t s = mf_row_decode(row, len, 0, &v, why);
    if (s == MF_OK)
        s = check_key(&v, &k, why);
    return s == MF_OK ? MF_OK : MF_DATA_LOSS;
}

static void on_read_done(mfd_ssd_job_t *j)
{
    read_ctx_t *r = j->arg;
    mfd_store_t *st = r->st;
    mfd_entry_t *e = r->e;
    mf_status_t s = j->status;
    uint8_t *buf = j->out;
    size_t len = j->out_len;
    j->out = NULL;
    if (s == MF_OK || s == MF_DATA_LOSS) {
        mfd_count(st->metrics, MFD_C_SSD_READS, 1);
        mfd_count(st->metrics, MFD_C_SSD_READ_BYTES, len);
    }
    if (s == MF_DATA_LOSS) {
        mfd_warn("ssd: row of %zu bytes fails validation (%s); dropping it", len,
                 j->why ? j->why : "?");
        mfd_count(st->metrics, MFD_C_DATA_LOSS, 1);
        mfd_count(st->metrics, MFD_C_SSD_CORRUPT, 1);
        mfd_store_remove(st, e);
    } else if (s == MF_NOT_FOUND) {
        /* The index said it was there: the record vanished (e.g. deleted by hand). */
        mfd_store_remove(st, e);
    } else if (s != MF_OK) {
        mfd_count(st->metrics, MFD_C_SSD_ERRORS, 1);
    }
    if (r->blk) {
        /* The worker read straight into the reserved block: it becomes the host copy. */
        if (s == MF_OK && e->linked && !e->host) {
            e->host = r->blk;
            st->host_entries++;
            mfd_lru_add(st->ix, MFD_LRU_HOST, e);
            mfd_count(st->metrics, MFD_C_PROMOTIONS, 1);
        } else {
            if (s == MF_OK && !e->host) { /* removed while it was read: hand out a copy */
                buf = aligned_alloc(64, mfd_arena_round(len));
                if (buf)
                    memcpy(buf, mfd_arena_base(st->arena) + mfd_ablock_offset(r->blk), len);
                else
                    s = MF_RESOURCE_EXHAUSTED;
            }
            mfd_store_unreserve(st, r->blk);
        }
    } else if (s == MF_OK && r->promote && e->linked && !e->host) {
        mfd_ablock_t *blk;
        if (mfd_store_reserve(st, len, &blk) == MF_OK) {
            memcpy(mfd_arena_base(st->arena) + mfd_ablock_offset(blk), buf, len);
            e->host = blk;
            st->host_entries++;
            mfd_lru_add(st->ix, MFD_LRU_HOST, e);
            mfd_count(st->metrics, MFD_C_PROMOTIONS, 1);
            free(buf);
            buf = NULL;
        }
    }
    if (s != MF_OK) {
        free(buf);
        buf = NULL;
        len = 0;
    } else if (e->linked && (buf || e->host)) {
        /* Validated on the worker: later lookups of this block need not read the row. */
        note_row(st, e, buf ? buf : mfd_store_bytes(st, e), len);
    }
    r->cb(r->arg, e, s, buf, len);
    free(r);
    mfd_ssd_job_free(j);
    mfd_index_unpin(st->ix, e);
    balance(st, NULL);
}

void mfd_store_read(mfd_store_t *st, mfd_entry_t *e, int promote, mfd_store_read_cb cb,
                    void *arg)
{
    read_ctx_t *r = st->ssd ? calloc(1, sizeof(*r)) : NULL;
    mfd_ssd_job_t *j = r ? mfd_ssd_job_new(MFD_SSD_GET_ROW, e->key.b, e->key.len) : NULL;
    if (!j) {
        free(r);
        cb(arg, e, st->ssd ? MF_RESOURCE_EXHAUSTED : MF_NOT_FOUND, NULL, 0);
        return;
    }
    *r = (read_ctx_t){st, e, promote, NULL, cb, arg};
    mfd_entry_pin(e); /* before the reservation, whose evictions skip pinned rows */
    j->expect_len = e->size;
    j->check = check_read;
    if (promote && !e->host && mfd_store_reserve(st, e->size, &r->blk) == MF_OK)
        j->dst = mfd_arena_base(st->arena) + mfd_ablock_offset(r->blk);
    j->cb = on_read_done;
    j->arg = r;
    mfd_ssd_submit(st->ssd, j);
}

/* ---- a put's row, tier-blind (store.h) ----------------------------------------------- */

mf_status_t mfd_store_place(mfd_store_t *st, uint64_t size, int prefer_host, int pref,
                            mfd_slot_t *out)
{
    mf_status_t s = MF_UNAVAILABLE;
    *out = (mfd_slot_t){NULL, size, 0, 0};
    if (st->gpu && !prefer_host)
        s = mfd_store_reserve_gpu(st, size, pref, &out->arena, &out->blk);
    out->gpu = s == MF_OK;
    if (s != MF_OK)
        s = mfd_store_reserve(st, size, &out->blk);
    if (s != MF_OK && st->gpu && prefer_host) {
        s = mfd_store_reserve_gpu(st, size, pref, &out->arena, &out->blk);
        out->gpu = s == MF_OK;
    }
    return s == MF_OK ? MF_OK : MF_RESOURCE_EXHAUSTED;
}

void mfd_store_unplace(mfd_store_t *st, mfd_slot_t *slot)
{
    if (!slot->blk)
        return;
    if (slot->gpu)
        mfd_store_unreserve_gpu(st, slot->arena, slot->blk);
    else
        mfd_store_unreserve(st, slot->blk);
    slot->blk = NULL;
}

uint64_t mfd_slot_offset(const mfd_slot_t *slot)
{
    return mfd_ablock_offset(slot->blk);
}

mf_status_t mfd_store_write(mfd_store_t *st, const mfd_slot_t *slot, const void *src,
                            size_t len)
{
    if (len > slot->size)
        return MF_INVALID_ARGUMENT;
    if (slot->gpu)
        return mfd_gpu_write(st->gpu, slot->arena, slot->blk, src, len);
    memcpy(mfd_arena_base(st->arena) + mfd_ablock_offset(slot->blk), src, len);
    return MF_OK;
}

mf_status_t mfd_store_commit_slot(mfd_store_t *st, const mfd_key_t *key, mfd_slot_t *slot,
                                  int durable, mfd_store_done_cb done, void *arg,
                                  int *pending, int *is_durable, int *replaced,
                                  const char **why)
{
    mfd_ablock_t *blk = slot->blk;
    slot->blk = NULL;
    return slot->gpu ? mfd_store_commit_gpu(st, key, slot->arena, blk, slot->size, durable,
                                            done, arg, pending, is_durable, replaced, why)
                     : mfd_store_commit(st, key, blk, slot->size, durable, done, arg,
                                        pending, is_durable, replaced, why);
}

/* ---- a Get's row, tier-blind (store.h) ------------------------------------------------ */

mf_status_t mfd_store_view(mfd_store_t *st, mfd_entry_t *e, int lease, uint64_t gpu_mapped,
                           mfd_view_t *v)
{
    *v = (mfd_view_t){0};
    if (lease && e->gpu && ((gpu_mapped >> e->gpu_arena) & 1)) {
        /* A device view: the client mapped this arena. The hit check reads the head copy. */
        v->tier = MAPFLOW__V1__TIER__TIER_GPU;
        v->gpu_arena = e->gpu_arena;
        v->bytes = mfd_store_head(st, e);
        return MF_OK;
    }
    /* A client that cannot reach the row's GPU arena gets it staged in the host arena
     * (the entry keeps that copy; the lease pins it like any host row). */
    if (lease && !e->host && e->gpu && mfd_store_stage_host(st, e) != MF_OK)
        return MF_RESOURCE_EXHAUSTED;
    const uint8_t *bytes = mfd_store_bytes(st, e);
    if (e->host) {
        v->tier = MAPFLOW__V1__TIER__TIER_HOST;
        v->bytes = bytes; /* the host block stays put while the row is pinned */
        return MF_OK;
    }
    if (!lease && e->gpu) {
        /* GET_COPY of a GPU row: DtoH into a buffer the reply sends. */
        uint8_t *buf = aligned_alloc(64, mfd_arena_round(e->size));
        if (!buf)
            return MF_RESOURCE_EXHAUSTED;
        if (mfd_store_gpu_read(st, e, buf) != MF_OK) {
            free(buf);
            return MF_INTERNAL;
        }
        v->tier = MAPFLOW__V1__TIER__TIER_GPU;
        v->bytes = v->owned = buf;
        return MF_OK;
    }
    if (!lease && bytes) {
        /* A demotion copy is freed when its write completes, maybe before the reply. */
        uint8_t *buf = malloc(e->size);
        if (!buf)
            return MF_RESOURCE_EXHAUSTED;
        memcpy(buf, bytes, e->size);
        v->tier = MAPFLOW__V1__TIER__TIER_SSD;
        v->bytes = v->owned = buf;
        return MF_OK;
    }
    v->need_read = 1;
    return MF_OK;
}
