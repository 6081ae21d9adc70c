/* store_ssd — the store's SSD side: async write-through (straight from the host block,
 * bounded to an eighth of the arena, the rest deferred on a FIFO), sync writes for durable
 * puts, the SSD budget (ssd_bytes), and reading rows back (with promotion). See store.h;
 * loop thread only (RocksDB completions arrive there). */
#include "store.h"
#include "store_internal.h"
#include "log.h"

#include <stdlib.h>
#include <string.h>

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

uint64_t mfd_store_wt_limit(const mfd_store_t *st)
{
    return mfd_arena_capacity(st->arena) / 8;
}

void mfd_store_defer_add(mfd_store_t *st, mfd_entry_t *e)
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

void mfd_store_defer_remove(mfd_store_t *st, mfd_entry_t *e)
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

/* ---- SSD writes --------------------------------------------------------------------- */

void mfd_store_drop_host(mfd_store_t *st, mfd_entry_t *e)
{
    mfd_arena_free(st->arena, e->host);
    e->host = NULL;
    st->host_entries--;
    mfd_lru_remove(st->ix, MFD_LRU_HOST, e);
}

/* A 64-aligned host buffer with a GPU row's bytes (DtoH), or NULL. */
uint8_t *mfd_store_gpu_copy_out(mfd_store_t *st, const mfd_entry_t *e)
{
    uint8_t *b = aligned_alloc(64, mfd_arena_round(e->size));
    if (b && mfd_gpu_read(st->gpu, e->gpu_arena, e->gpu, b, e->size) != MF_OK) {
        free(b);
        b = NULL;
    }
    return b;
}

/* Drops e's SSD record (queued write included) from the accounting and deletes it. */
void mfd_store_ssd_forget(mfd_store_t *st, mfd_entry_t *e)
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
 * does not fit is refused instead, mfd_store_durable_room). */
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
                mfd_store_ssd_forget(st, e);       /* the memory copy stays */
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
int mfd_store_durable_room(mfd_store_t *st, const mfd_key_t *key, uint64_t size, const char **why)
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
    mfd_store_wt_pump(st, 0);
}

/* Queues a write of e's bytes; 0 when the SSD tier is off, full or out of memory.
 * wt: an async write-through straight from the host block (counted in wt_bytes and
 * cancellable until a worker starts it). */
int mfd_store_ssd_write(mfd_store_t *st, mfd_entry_t *e, const uint8_t *bytes, int sync,
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
int mfd_store_cancel_write(mfd_store_t *st, mfd_entry_t *e)
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
void mfd_store_wt_write(mfd_store_t *st, mfd_entry_t *e)
{
    const uint8_t *b = mfd_store_bytes(st, e); /* host block, or a copy already made */
    if (!b && e->gpu)
        b = e->wbuf = mfd_store_gpu_copy_out(st, e);
    if (b && !mfd_store_ssd_write(st, e, b, 0, NULL, NULL, 1) && !e->host) {
        free(e->wbuf);
        e->wbuf = NULL;
    }
}

/* Async write-through of a host row: now when the backlog allows, else deferred. */
void mfd_store_wt_start(mfd_store_t *st, mfd_entry_t *e)
{
    if (!st->ssd)
        return;
    if (st->wt_head || (st->wt_bytes && st->wt_bytes + e->size > mfd_store_wt_limit(st))) {
        mfd_store_defer_add(st, e);
        return;
    }
    mfd_store_wt_write(st, e);
}

/* Starts deferred write-throughs while the backlog has room (all: every one). A row
 * that left the host tier, reached the SSD otherwise or lost write_through is dropped
 * from the list. */
void mfd_store_wt_pump(mfd_store_t *st, int all)
{
    if (st->wt_pumping)
        return;
    st->wt_pumping = 1;
    while (st->wt_head &&
           (all || !st->wt_bytes || st->wt_bytes + st->wt_head->size <= mfd_store_wt_limit(st))) {
        mfd_entry_t *e = st->wt_head;
        mfd_store_defer_remove(st, e);
        if (e->linked && (e->host || e->gpu) && !e->on_ssd && !e->ssd_writing &&
            st->cfg->write_through != MFD_WT_OFF)
            mfd_store_wt_write(st, e);
    }
    st->wt_pumping = 0;
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
        s = mfd_store_check_key(&v, &k, why);
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
        mfd_store_note_row(st, e, buf ? buf : mfd_store_bytes(st, e), len);
    }
    r->cb(r->arg, e, s, buf, len);
    free(r);
    mfd_ssd_job_free(j);
    mfd_index_unpin(st->ix, e);
    mfd_store_balance(st, NULL);
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
