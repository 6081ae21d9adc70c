/* store — opening and closing the tiers, reservations, commit (validation, linking),
 * what a Get reads, and the tier-blind put / view calls (see store.h). Write-through and
 * SSD reads: store_ssd.c; demotion and eviction: store_evict.c. */
#include "store.h"
#include "store_internal.h"
#include "log.h"
#include "mf_clock.h"

#include <stdlib.h>
#include <string.h>

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

void mfd_store_drop_gpu(mfd_store_t *st, mfd_entry_t *e)
{
    gpu_release(st, e);
    mfd_lru_remove(st->ix, MFD_LRU_GPU, e);
}

static void on_entry_free(mfd_entry_t *e, void *ctx)
{
    mfd_store_t *st = ctx;
    mfd_store_defer_remove(st, e);
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
        int64_t t0 = mf_now_ms();
        s = mfd_ssd_scan(st->ssd, on_scan, st, err, errlen);
        if (s == MF_OK) {
            mfd_info("ssd tier: %llu rows (%llu bytes) found in %s/rocksdb in %lld ms",
                     (unsigned long long)st->ssd_entries, (unsigned long long)st->ssd_used,
                     cfg->data_dir, (long long)(mf_now_ms() - t0));
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


void mfd_store_drain(mfd_store_t *st)
{
    if (!st->ssd)
        return;
    mfd_store_wt_pump(st, 1);
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

uint8_t *mfd_store_host_base(const mfd_store_t *st) { return mfd_arena_base(st->arena); }

uint64_t mfd_store_host_capacity(const mfd_store_t *st) { return mfd_arena_capacity(st->arena); }

int mfd_store_host_fd(const mfd_store_t *st) { return mfd_arena_fd(st->arena); }

uint8_t *mfd_store_block_ptr(const mfd_store_t *st, const mfd_ablock_t *blk)
{
    return mfd_arena_base(st->arena) + mfd_ablock_offset(blk);
}

void mfd_store_tiers(const mfd_store_t *st, mfd_tier_info_t out[3])
{
    memset(out, 0, 3 * sizeof(*out));
    mfd_gpu_t *g = st->gpu;
    out[0] = (mfd_tier_info_t){MAPFLOW__V1__TIER__TIER_GPU, "gpu", g != NULL, mfd_gpu_used(g),
                               mfd_gpu_capacity(g), st->gpu_entries, g ? NULL : st->gpu_why};
    out[1] = (mfd_tier_info_t){MAPFLOW__V1__TIER__TIER_HOST, "host", 1,
                               mfd_arena_used(st->arena), mfd_arena_capacity(st->arena),
                               st->host_entries, NULL};
    out[2] = (mfd_tier_info_t){MAPFLOW__V1__TIER__TIER_SSD, "ssd", st->ssd != NULL, st->ssd_used,
                               st->ssd ? st->cfg->ssd_bytes : 0, st->ssd_entries,
                               st->ssd ? NULL : "ssd_bytes is 0"};
}

mf_status_t mfd_store_reserve(mfd_store_t *st, uint64_t size, mfd_ablock_t **blk)
{
    mf_status_t s = mfd_arena_alloc(st->arena, size, blk);
    if (s != MF_RESOURCE_EXHAUSTED)
        return s;
    /* Free at least the size plus the watermark gap, so puts do not evict one by one. */
    uint64_t cap = mfd_arena_capacity(st->arena);
    uint64_t gap = (uint64_t)((st->cfg->high_watermark - st->cfg->low_watermark) * (double)cap);
    mfd_store_evict_host(st, mfd_arena_round(size) + gap, NULL, 0, NULL, NULL, NULL);
    return mfd_arena_alloc(st->arena, size, blk);
}

void mfd_store_unreserve(mfd_store_t *st, mfd_ablock_t *blk)
{
    mfd_arena_free(st->arena, blk);
}

mf_status_t mfd_store_reserve_gpu_in(mfd_store_t *st, uint64_t size, uint64_t mask, int pref,
                                     uint32_t *arena, mfd_ablock_t **blk)
{
    mfd_gpu_t *g = st->gpu;
    if (!g)
        return MF_UNAVAILABLE;
#define IN_MASK(i) ((i) >= 64 || ((mask >> (i)) & 1))
    int first = -1;
    if (pref >= 0 && (size_t)pref < g->n && IN_MASK((uint32_t)pref)) {
        first = pref;
    } else {
        uint64_t best = 0;
        for (uint32_t i = 0; i < g->n; i++) {
            uint64_t f = mfd_oalloc_largest_free(g->a[i].alloc);
            if (IN_MASK(i) && (first < 0 || f > best)) {
                best = f;
                first = (int)i;
            }
        }
    }
    if (first < 0)
        return MF_RESOURCE_EXHAUSTED;
    mf_status_t s = mfd_gpu_alloc(g, (uint32_t)first, size, blk);
    if (s == MF_RESOURCE_EXHAUSTED && size <= g->a[first].bytes) {
        /* Free the size plus the watermark gap, so puts do not mfd_store_demote one by one. */
        uint64_t gap = (uint64_t)((st->cfg->high_watermark - st->cfg->low_watermark) *
                                  (double)g->a[first].bytes);
        mfd_store_evict_gpu(st, first, mfd_arena_round(size) + gap, NULL, 0, NULL, NULL, NULL);
        s = mfd_gpu_alloc(g, (uint32_t)first, size, blk);
    }
    for (uint32_t i = 0; s == MF_RESOURCE_EXHAUSTED && i < g->n; i++)
        if ((int)i != first && IN_MASK(i) && (s = mfd_gpu_alloc(g, i, size, blk)) == MF_OK)
            first = (int)i;
#undef IN_MASK
    if (s == MF_OK)
        *arena = (uint32_t)first;
    return s;
}

mf_status_t mfd_store_reserve_gpu(mfd_store_t *st, uint64_t size, int pref, uint32_t *arena,
                                  mfd_ablock_t **blk)
{
    return mfd_store_reserve_gpu_in(st, size, ~0ull, pref, arena, blk);
}

void mfd_store_unreserve_gpu(mfd_store_t *st, uint32_t arena, mfd_ablock_t *blk)
{
    mfd_gpu_free(st->gpu, arena, blk);
}

/* ---- rows ------------------------------------------------------------------------- */

/* Marks e's layer in its block index node from a row validated in full just now. */
void mfd_store_note_row(mfd_store_t *st, mfd_entry_t *e, const uint8_t *row, size_t len)
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
mf_status_t mfd_store_check_key(const mf_row_view_t *v, const mfd_key_t *key, const char **why)
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
        s = mfd_store_check_key(v, key, why);
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
    e->last_access_ms = (uint64_t)mf_now_ms();
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
    if (s == MF_OK && durable && !mfd_store_durable_room(st, key, size, why))
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
        *pending = mfd_store_ssd_write(st, e, row, 1, done, arg, 0);
    else if (wt == MFD_WT_ASYNC)
        mfd_store_wt_start(st, e);
    /* Never the row just made visible: it is acknowledged, so it stays until later
     * pressure demotes it like any other row. */
    mfd_store_balance(st, e);
    return MF_OK;
}

/* Validates a GPU row from its checked bytes (mfd_gpu_check_row / _rows: the whole row,
 * or its prefix up to the tiles with the checksum computed on the GPU); counts the outcome. */
static mf_status_t validate_checked(mfd_store_t *st, const mfd_key_t *key, const uint8_t *stg,
                                    uint64_t size, uint64_t sum, int on_gpu, mf_row_view_t *v,
                                    const char **why)
{
    /* The decoder reads a row's bytes before its tiles only (prefix) once the checksum
     * is skipped, and a row it would refuse from its header came with those bytes. */
    mf_status_t s = validate_flags(st, key, stg, size, on_gpu ? MF_ROW_NO_CHECKSUM : 0, v, why);
    if (s == MF_OK && on_gpu && ((const mf_row_header_t *)stg)->checksum != sum) {
        mfd_count(st->metrics, MFD_C_PUT_REJECTED, 1);
        *why = "checksum mismatch (computed on the GPU)";
        s = MF_DATA_LOSS;
    }
    if (s == MF_OK)
        mfd_count(st->metrics, on_gpu ? MFD_C_GPU_VERIFY_GPU : MFD_C_GPU_VERIFY_HOST, 1);
    return s;
}

/* Makes a validated GPU row (v from its checked bytes stg, `have` of them) visible in blk,
 * with its write-through; on failure (s, or no memory) blk is freed. */
static mf_status_t gpu_link(mfd_store_t *st, mf_status_t s, const mfd_key_t *key,
                            uint32_t arena, mfd_ablock_t *blk, uint64_t size, int durable,
                            const uint8_t *stg, size_t have, const mf_row_view_t *v,
                            mfd_store_done_cb done, void *arg, int *pending, int *replaced,
                            const char **why)
{
    if (s == MF_OK && durable && !mfd_store_durable_room(st, key, size, why))
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
    link_entry(st, key, e, v, size, replaced);
    mfd_lru_add(st->ix, MFD_LRU_GPU, e);

    /* Write-through needs the whole row on the host: a copy of the staging bytes when the
     * row was validated there, else a DtoH (the entry's wbuf until the write is done). */
    int wt = st->cfg->write_through;
    int want_wt = durable || wt == MFD_WT_SYNC || (wt == MFD_WT_ASYNC && st->ssd);
    uint8_t *copy = NULL;
    int backlog = st->wt_head || (st->wt_bytes && st->wt_bytes + size > mfd_store_wt_limit(st));
    if (want_wt && !(wt == MFD_WT_ASYNC && !durable && backlog)) {
        if (have == size && (copy = aligned_alloc(64, mfd_arena_round(size))))
            memcpy(copy, stg, size);
        else
            copy = mfd_store_gpu_copy_out(st, e);
    }
    if (durable || wt == MFD_WT_SYNC) {
        e->wbuf = copy;
        *pending = copy ? mfd_store_ssd_write(st, e, e->wbuf, 1, done, arg, 0) : 0;
        if (!*pending) {
            free(e->wbuf);
            e->wbuf = NULL;
        }
    } else if (wt == MFD_WT_ASYNC && st->ssd) {
        if (!copy) {
            mfd_store_defer_add(st, e); /* copied out again when its turn comes */
        } else {
            e->wbuf = copy;
            mfd_store_wt_write(st, e);
        }
    }
    mfd_store_balance_gpu(st, arena, e);
    return MF_OK;
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
    int64_t t0 = mf_now_us();
    mf_status_t s = mfd_gpu_check_row(st->gpu, arena, blk, size, &stg, &have, &sum, &on_gpu);
    int64_t t1 = mf_now_us();
    mfd_count(st->metrics, MFD_C_GPU_COMMIT_CHECK_US, (uint64_t)(t1 - t0));
    *why = "cannot copy the row out of the GPU arena";
    if (s == MF_OK)
        s = validate_checked(st, key, stg, size, sum, on_gpu, &v, why);
    s = gpu_link(st, s, key, arena, blk, size, durable, stg, have, &v, done, arg, pending,
                 replaced, why);
    if (s == MF_OK)
        mfd_count(st->metrics, MFD_C_GPU_COMMIT_US, (uint64_t)(mf_now_us() - t0));
    return s;
}

mf_status_t mfd_store_commit_region_row(mfd_store_t *st, const mfd_key_t *key, uint32_t arena,
                                        mfd_ablock_t *blk, const mfd_gpu_rowcheck_t *chk,
                                        int *replaced, const char **why)
{
    int pending = 0;
    *replaced = 0;
    mf_row_view_t v;
    mf_status_t s = chk->st;
    if (s != MF_OK)
        *why = chk->why;
    else
        s = validate_checked(st, key, chk->bytes, chk->size, chk->sum, chk->sum_valid, &v, why);
    /* Not durable: no SSD completion to wait for (write-through as configured). */
    return gpu_link(st, s, key, arena, blk, chk->size, 0, chk->bytes, chk->have, &v, NULL,
                    NULL, &pending, replaced, why);
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
    mfd_store_touch_at(st, e, (uint64_t)mf_now_ms());
}

void mfd_store_touch_at(mfd_store_t *st, mfd_entry_t *e, uint64_t now_ms)
{
    e->last_access_ms = now_ms;
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
    mfd_store_defer_remove(st, e);
    int cancelled = mfd_store_cancel_write(st, e);
    if (e->on_ssd || e->ssd_writing)
        mfd_store_ssd_forget(st, e);
    mfd_index_unlink(st->ix, e);
    if (cancelled)
        mfd_store_wt_pump(st, 0);
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
