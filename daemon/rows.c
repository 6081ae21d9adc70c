/* rows — Put, Lookup, Get and Release: the data-path requests (see rows.h). */
#include "rows.h"
#include "keys.h"
#include "lease.h"
#include "log.h"
#include "mf_clock.h"
#include "peer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "tokens travel as u32 LE and are used in place: little-endian hosts only"
#endif

/* Arenas of this connection's GPU mask: only announced ones, only on the unix socket. */
static uint64_t gpu_mask(const mfd_conn_t *c, uint64_t asked)
{
    size_t n = c->gpu_arenas;
    return n ? asked & (n >= 64 ? ~0ull : (1ull << n) - 1) : 0;
}

/* ==== Put ============================================================================= */

void mfd_rows_put_begin(mfd_conn_t *c, uint64_t rid, const Mapflow__V1__PutBegin *m)
{
    mfd_server_t *s = c->srv;
    const char *why = NULL;
    mfd_key_t key;
    if (mfd_keys_from_msg(c, m->key, &key, &why) != MF_OK) {
        mfd_conn_error(c, rid, MF_INVALID_ARGUMENT, "PutBegin: %s", why);
        return;
    }
    uint64_t cap = mfd_store_host_capacity(&s->store);
    if (m->size < MF_ROW_HEADER || m->size > s->cfg.max_frame || m->size > MF_ROW_MAX_BYTES ||
        m->size > cap) {
        mfd_conn_error(c, rid, MF_INVALID_ARGUMENT,
                       "PutBegin: size %llu outside [%u, %llu] (row header, max_frame, host arena)",
                       (unsigned long long)m->size, MF_ROW_HEADER,
                       (unsigned long long)(s->cfg.max_frame < cap ? s->cfg.max_frame : cap));
        return;
    }
    uint64_t quota = (uint64_t)(s->cfg.reservation_share * (double)cap);
    if (c->acct && c->acct->reserved + m->size > quota) {
        mfd_conn_error(c, rid, MF_RESOURCE_EXHAUSTED,
                       "PutBegin: namespace '%s' already holds %llu bytes of uncommitted "
                       "reservations; %llu more exceed its quota of %llu (reservation_share "
                       "%g of the host arena)",
                       c->ns, (unsigned long long)c->acct->reserved,
                       (unsigned long long)m->size, (unsigned long long)quota,
                       s->cfg.reservation_share);
        return;
    }
    mfd_reservation_t *r = calloc(1, sizeof(*r));
    if (!r) {
        mfd_conn_error(c, rid, MF_RESOURCE_EXHAUSTED, "PutBegin: out of memory");
        return;
    }
    int pref = m->gpu_arena ? (int)m->gpu_arena - 1 : -1;
    if (mfd_store_place(&s->store, m->size, m->want_tier == MAPFLOW__V1__TIER__TIER_HOST, pref,
                        &r->slot) != MF_OK) {
        free(r);
        mfd_conn_error(c, rid, MF_RESOURCE_EXHAUSTED,
                       "PutBegin: no room for %llu bytes in the %s arena (pinned or reserved)",
                       (unsigned long long)m->size, s->store.gpu ? "GPU or host" : "host");
        return;
    }
    r->key = key;
    r->acct = c->acct;
    if (r->acct)
        r->acct->reserved += r->slot.size;
    r->durable = m->durable;
    r->in_arena = r->slot.gpu ? (int)((gpu_mask(c, m->gpu_mapped) >> r->slot.arena) & 1)
                              : c->has_arena;
    mfd_tickets_add(s->tickets, &r->t, MFD_TICKET_RESERVATION, c,
                    (uint64_t)mf_now_ms() + s->cfg.reservation_ttl_ms);
    Mapflow__V1__PutBeginReply rep = MAPFLOW__V1__PUT_BEGIN_REPLY__INIT;
    rep.reservation_id = r->t.id;
    rep.in_arena = r->in_arena;
    rep.arena_offset = r->in_arena ? mfd_slot_offset(&r->slot) : 0;
    rep.ttl_ms = s->cfg.reservation_ttl_ms;
    rep.tier = r->slot.gpu ? MAPFLOW__V1__TIER__TIER_GPU : MAPFLOW__V1__TIER__TIER_HOST;
    rep.gpu_arena = r->slot.gpu ? r->slot.arena : 0;
    MFD_REPLY(c, rid, PUT_BEGIN_REPLY, put_begin_reply, &rep, NULL, 0);
}

typedef struct commit_op {
    mfd_conn_t *c;
    uint64_t rid;
    int replaced;
    int gpu;
    double t0;
} commit_op_t;

static void reply_commit(mfd_conn_t *c, uint64_t rid, int gpu, int durable, int replaced,
                         double t0)
{
    Mapflow__V1__PutCommitReply rep = MAPFLOW__V1__PUT_COMMIT_REPLY__INIT;
    rep.tier = gpu ? MAPFLOW__V1__TIER__TIER_GPU : MAPFLOW__V1__TIER__TIER_HOST;
    rep.durable = durable;
    rep.replaced = replaced;
    mfd_metrics_observe(&c->srv->metrics, MFD_H_PUT, mf_now_s() - t0);
    MFD_REPLY(c, rid, PUT_COMMIT_REPLY, put_commit_reply, &rep, NULL, 0);
}

static void on_commit_synced(void *arg, mf_status_t st, int durable)
{
    commit_op_t *op = arg;
    if (st != MF_OK)
        mfd_conn_error(op->c, op->rid, MF_UNAVAILABLE,
                       "row is visible but its synced SSD write failed: %s", mf_strerror(st));
    else
        reply_commit(op->c, op->rid, op->gpu, durable, op->replaced, op->t0);
    mfd_conn_unhold(op->c);
    free(op);
}

void mfd_rows_put_commit(mfd_conn_t *c, uint64_t rid, const Mapflow__V1__PutCommit *m,
                         const uint8_t *payload, size_t plen, double t0)
{
    mfd_server_t *s = c->srv;
    mfd_ticket_t *t = mfd_tickets_find(s->tickets, m->reservation_id, MFD_TICKET_RESERVATION, c);
    if (!t) {
        mfd_conn_error(c, rid, MF_NOT_FOUND, "PutCommit: unknown or expired reservation %llu",
                       (unsigned long long)m->reservation_id);
        return;
    }
    mfd_reservation_t *r = (mfd_reservation_t *)t;
    if ((plen || !r->in_arena) && plen != r->slot.size) {
        mfd_conn_error(c, rid, MF_INVALID_ARGUMENT,
                       "PutCommit: payload of %zu bytes, reservation is %llu", plen,
                       (unsigned long long)r->slot.size);
        mfd_ticket_release(t, s);
        return;
    }
    if (plen && mfd_store_write(&s->store, &r->slot, payload, plen) != MF_OK) {
        mfd_conn_error(c, rid, MF_INTERNAL, "PutCommit: copy into the GPU arena failed");
        mfd_ticket_release(t, s);
        return;
    }
    mfd_tickets_remove(s->tickets, t);
    mfd_reservation_unaccount(r); /* committing: the block becomes a row (or is freed) */
    commit_op_t *op = calloc(1, sizeof(*op));
    if (!op) {
        mfd_reservation_free(s, r);
        mfd_conn_error(c, rid, MF_RESOURCE_EXHAUSTED, "PutCommit: out of memory");
        return;
    }
    *op = (commit_op_t){c, rid, 0, r->slot.gpu, t0};
    int pending, durable, replaced;
    const char *why = "invalid row";
    mf_status_t st = mfd_store_commit_slot(&s->store, &r->key, &r->slot, r->durable,
                                           on_commit_synced, op, &pending, &durable, &replaced,
                                           &why);
    int gpu = r->slot.gpu;
    free(r);
    if (st != MF_OK) {
        free(op);
        mfd_conn_error(c, rid, st, "PutCommit: %s", why);
        return;
    }
    if (pending) {
        op->replaced = replaced;
        mfd_conn_hold(c);
        return;
    }
    free(op);
    reply_commit(c, rid, gpu, durable, replaced, t0);
}

void mfd_rows_put_abort(mfd_conn_t *c, uint64_t rid, const Mapflow__V1__PutAbort *m)
{
    mfd_ticket_t *t = mfd_tickets_find(c->srv->tickets, m->reservation_id,
                                       MFD_TICKET_RESERVATION, c);
    if (!t) {
        mfd_conn_error(c, rid, MF_NOT_FOUND, "PutAbort: unknown or expired reservation %llu",
                       (unsigned long long)m->reservation_id);
        return;
    }
    mfd_ticket_release(t, c->srv);
    Mapflow__V1__PutAbortReply rep = MAPFLOW__V1__PUT_ABORT_REPLY__INIT;
    MFD_REPLY(c, rid, PUT_ABORT_REPLY, put_abort_reply, &rep, NULL, 0);
}

/* ==== Put regions ===================================================================== */

void mfd_rows_region_begin(mfd_conn_t *c, uint64_t rid, const Mapflow__V1__PutRegionBegin *m)
{
    mfd_server_t *s = c->srv;
    mfd_gpu_t *g = s->store.gpu;
    const char *why = NULL;
    if (!g) {
        mfd_conn_error(c, rid, MF_FAILED_PRECONDITION,
                       "PutRegionBegin: the GPU tier is off (%s); put the rows one by one "
                       "(mf_put_device_batch)", s->store.gpu_why);
        return;
    }
    uint64_t mask = gpu_mask(c, m->gpu_mapped);
    if (!mask) {
        mfd_conn_error(c, rid, MF_FAILED_PRECONDITION,
                       "PutRegionBegin: this connection mapped no GPU arena (unix socket, "
                       "Hello.want_gpu_arena, gpu_mapped); put the rows one by one "
                       "(mf_put_device_batch)");
        return;
    }
    /* Only the model here: rows carry their own B, checked at commit. */
    if (mfd_keys_check_model(m->model, &why) != MF_OK) {
        mfd_conn_error(c, rid, MF_INVALID_ARGUMENT, "PutRegionBegin: %s", why);
        return;
    }
    size_t n = m->n_lengths;
    if (n < 1 || n > MFD_REGION_MAX_ROWS) {
        mfd_conn_error(c, rid, MF_INVALID_ARGUMENT, "PutRegionBegin: %zu rows (want 1..%u)", n,
                       MFD_REGION_MAX_ROWS);
        return;
    }
    uint64_t total = 0, largest = 0;
    for (size_t i = 0; i < n; i++) {
        if (m->lengths[i] < MF_ROW_HEADER || m->lengths[i] > MF_ROW_MAX_BYTES) {
            mfd_conn_error(c, rid, MF_INVALID_ARGUMENT,
                           "PutRegionBegin: row %zu is %llu bytes (want %u..%u)", i,
                           (unsigned long long)m->lengths[i], MF_ROW_HEADER, MF_ROW_MAX_BYTES);
            return;
        }
        total += mfd_arena_round(m->lengths[i]); /* ≤ 2^16 × 2^32: no overflow */
    }
    for (uint32_t i = 0; i < g->n; i++)
        if (((mask >> i) & 1) && g->a[i].bytes > largest)
            largest = g->a[i].bytes;
    if (total > largest) {
        mfd_conn_error(c, rid, MF_INVALID_ARGUMENT,
                       "PutRegionBegin: %zu rows need %llu bytes, more than the largest mapped "
                       "GPU arena (%llu bytes); split the layer", n, (unsigned long long)total,
                       (unsigned long long)largest);
        return;
    }
    uint64_t quota = (uint64_t)(s->cfg.reservation_share * (double)largest);
    if (c->acct && c->acct->reserved + total > quota) {
        mfd_conn_error(c, rid, MF_RESOURCE_EXHAUSTED,
                       "PutRegionBegin: namespace '%s' already holds %llu bytes of uncommitted "
                       "reservations; %llu more exceed its quota of %llu (reservation_share %g "
                       "of the GPU arena)", c->ns, (unsigned long long)c->acct->reserved,
                       (unsigned long long)total, (unsigned long long)quota,
                       s->cfg.reservation_share);
        return;
    }
    mfd_region_t *r = calloc(1, sizeof(*r));
    uint64_t *off = r ? malloc(n * sizeof(*off)) : NULL, *len = r ? malloc(n * sizeof(*len)) : NULL;
    if (!r || !off || !len) {
        free(off);
        free(len);
        free(r);
        mfd_conn_error(c, rid, MF_RESOURCE_EXHAUSTED, "PutRegionBegin: out of memory");
        return;
    }
    r->off = off;
    r->len = len;
    int pref = m->gpu_arena ? (int)m->gpu_arena - 1 : -1;
    if (mfd_store_reserve_gpu_in(&s->store, total, mask, pref, &r->arena, &r->blk) != MF_OK) {
        r->blk = NULL;
        mfd_region_free(s, r);
        mfd_conn_error(c, rid, MF_RESOURCE_EXHAUSTED,
                       "PutRegionBegin: no GPU arena this connection mapped has room for %llu "
                       "bytes (pinned or reserved rows); put the rows one by one "
                       "(mf_put_device_batch)", (unsigned long long)total);
        return;
    }
    r->bytes = total;
    snprintf(r->model, sizeof(r->model), "%s", m->model);
    snprintf(r->ns, sizeof(r->ns), "%s", c->ns);
    r->layer = m->layer;
    r->n = (uint32_t)n;
    r->caps = m->capacities;
    uint64_t at = mfd_ablock_offset(r->blk);
    for (size_t i = 0; i < n; i++) {
        off[i] = at;
        len[i] = m->lengths[i];
        at += mfd_arena_round(m->lengths[i]);
    }
    r->acct = c->acct;
    if (r->acct)
        r->acct->reserved += total;
    mfd_tickets_add(s->tickets, &r->t, MFD_TICKET_REGION, c,
                    (uint64_t)mf_now_ms() + s->cfg.reservation_ttl_ms);
    Mapflow__V1__PutRegionBeginReply rep = MAPFLOW__V1__PUT_REGION_BEGIN_REPLY__INIT;
    rep.region_id = r->t.id;
    rep.gpu_arena = r->arena;
    rep.arena_offset = off[0];
    rep.bytes = total;
    rep.n_row_offsets = n;
    rep.row_offsets = off;
    rep.ttl_ms = s->cfg.reservation_ttl_ms;
    MFD_REPLY(c, rid, PUT_REGION_BEGIN_REPLY, put_region_begin_reply, &rep, NULL, 0);
}

/* The key row i of region r claims: r's model and layer under c's namespace, the hash its
 * checked header carries (the commit then checks hash = H(parent, tokens)). */
static mf_status_t region_key(const mfd_conn_t *c, const mfd_region_t *r,
                              const mfd_gpu_rowcheck_t *chk, mfd_key_t *key, const char **why)
{
    if (chk->st != MF_OK || chk->have < MF_ROW_HEADER) {
        *why = chk->st != MF_OK ? chk->why : "row shorter than its header";
        return chk->st != MF_OK ? chk->st : MF_INVALID_ARGUMENT;
    }
    mf_row_header_t h;
    memcpy(&h, chk->bytes, sizeof(h));
    Mapflow__V1__Key k = MAPFLOW__V1__KEY__INIT;
    k.model = (char *)r->model;
    k.layer = r->layer;
    k.hash.data = h.hash;
    k.hash.len = sizeof(h.hash);
    return mfd_keys_from_msg(c, &k, key, why);
}

/* Why m's lengths do not fit region r, into why (0: they fit): a capacities region needs
 * one actual length per row, each in [MF_ROW_HEADER, its capacity]; an exact one none. */
static int region_lengths_bad(const mfd_region_t *r, const Mapflow__V1__PutRegionCommit *m,
                              char *why, size_t cap)
{
    if (!r->caps) {
        if (m->n_lengths)
            snprintf(why, cap, "%zu lengths given for a region begun with exact lengths",
                     m->n_lengths);
        return m->n_lengths != 0;
    }
    if (m->n_lengths != r->n) {
        snprintf(why, cap, "%zu lengths for a region of %u rows begun with capacities",
                 m->n_lengths, r->n);
        return 1;
    }
    for (uint32_t i = 0; i < r->n; i++)
        if (m->lengths[i] < MF_ROW_HEADER || m->lengths[i] > r->len[i]) {
            snprintf(why, cap, "row %u is %llu bytes (want %u..%llu, its capacity)", i,
                     (unsigned long long)m->lengths[i], MF_ROW_HEADER,
                     (unsigned long long)r->len[i]);
            return 1;
        }
    return 0;
}

/* Gives the slack after a row of `len` bytes in its capacity block back to the arena. Out
 * of block nodes, the slack stays with the row and is freed with it (nothing lost). */
static void region_trim(mfd_server_t *s, uint32_t arena, mfd_ablock_t *blk, uint64_t len)
{
    mfd_ablock_t *slack;
    uint64_t keep = mfd_arena_round(len);
    if (keep < mfd_ablock_size(blk) &&
        mfd_gpu_split(s->store.gpu, arena, blk, keep, &slack) == MF_OK)
        mfd_store_unreserve_gpu(&s->store, arena, slack);
}

void mfd_rows_region_commit(mfd_conn_t *c, uint64_t rid, const Mapflow__V1__PutRegionCommit *m,
                            double t0)
{
    mfd_server_t *s = c->srv;
    mfd_ticket_t *t = mfd_tickets_find(s->tickets, m->region_id, MFD_TICKET_REGION, c);
    if (!t) {
        mfd_conn_error(c, rid, MF_NOT_FOUND,
                       "PutRegionCommit: region %llu is unknown, already committed or aborted, "
                       "expired, or another connection's", (unsigned long long)m->region_id);
        return;
    }
    mfd_region_t *r = (mfd_region_t *)t;
    if (strcmp(r->ns, c->ns) != 0) { /* owner implies namespace; checked all the same */
        mfd_conn_error(c, rid, MF_NOT_FOUND, "PutRegionCommit: region %llu is not this "
                       "namespace's", (unsigned long long)m->region_id);
        return;
    }
    /* Wrong lengths refuse the commit, not the region: it stays open (commit again, abort,
     * or its TTL / the connection frees it), so nothing is lost or leaked. */
    char bad[160];
    if (region_lengths_bad(r, m, bad, sizeof(bad))) {
        mfd_conn_error(c, rid, MF_INVALID_ARGUMENT, "PutRegionCommit: %s", bad);
        return;
    }
    mfd_tickets_remove(s->tickets, t);
    uint32_t n = r->n;
    uint32_t *status = malloc(n * sizeof(*status));
    mfd_gpu_rowcheck_t *chk = calloc(n, sizeof(*chk));
    mfd_ablock_t **piece = calloc(n, sizeof(*piece));
    mf_status_t st = status && chk && piece ? MF_OK : MF_RESOURCE_EXHAUSTED;
    /* One block per row, so each row is evicted, replaced and freed on its own. */
    mfd_ablock_t *cur = r->blk;
    for (uint32_t i = 0; st == MF_OK && i < n; i++) {
        piece[i] = cur;
        if (i + 1 < n && (st = mfd_gpu_split(s->store.gpu, r->arena, cur,
                                             r->off[i + 1] - r->off[i], &cur)) != MF_OK)
            piece[i] = NULL; /* cur (rows i..) is still r->blk's tail: freed below */
    }
    if (st != MF_OK) {
        for (uint32_t i = 0; piece && i < n && piece[i]; i++)
            if (piece[i] != cur)
                mfd_store_unreserve_gpu(&s->store, r->arena, piece[i]);
        r->blk = cur; /* the uncut rest (all of it when nothing was cut) */
        mfd_region_free(s, r);
        free(status);
        free(chk);
        free(piece);
        mfd_conn_error(c, rid, MF_RESOURCE_EXHAUSTED, "PutRegionCommit: out of memory");
        return;
    }
    if (r->acct)
        r->acct->reserved -= r->bytes; /* committing: the blocks become rows (or are freed) */
    r->acct = NULL;
    r->blk = NULL;
    for (uint32_t i = 0; i < n; i++) {
        chk[i].off = r->off[i];
        chk[i].size = r->caps ? m->lengths[i] : r->len[i];
        if (r->caps)
            region_trim(s, r->arena, piece[i], chk[i].size);
    }
    uint32_t ok = 0, replaced_n = 0, first_failed = n;
    const char *first_why = "";
    int on_gpu = 1;
    uint64_t check_us = 0;
    for (uint32_t done = 0; done < n;) {
        int64_t c0 = mf_now_us();
        size_t k = mfd_gpu_check_rows(s->store.gpu, r->arena, chk + done, n - done);
        check_us += (uint64_t)(mf_now_us() - c0);
        for (size_t i = done; i < done + k; i++) {
            const char *why = "invalid row";
            mfd_key_t key;
            int replaced = 0;
            mf_status_t rs = region_key(c, r, &chk[i], &key, &why);
            if (rs == MF_OK) {
                rs = mfd_store_commit_region_row(&s->store, &key, r->arena, piece[i], &chk[i],
                                                 &replaced, &why);
            } else {
                mfd_count(&s->metrics, MFD_C_PUT_REJECTED, 1);
                mfd_store_unreserve_gpu(&s->store, r->arena, piece[i]);
            }
            piece[i] = NULL;
            if (chk[i].size > MFD_GPU_RC_HEAD && !chk[i].sum_valid)
                on_gpu = 0;
            status[i] = (uint32_t)rs;
            if (rs == MF_OK) {
                ok++;
                replaced_n += (uint32_t)replaced;
            } else {
                mfd_metrics_error(&s->metrics, rs);
                if (first_failed == n) {
                    first_failed = (uint32_t)i;
                    first_why = why;
                }
            }
        }
        done += (uint32_t)k;
    }
    mfd_count(&s->metrics, MFD_C_REGION_COMMITS, 1);
    mfd_count(&s->metrics, MFD_C_REGION_CHECK_US, check_us);
    mfd_count(&s->metrics, MFD_C_GPU_COMMIT_CHECK_US, check_us);
    char msg[300] = "";
    if (first_failed < n)
        snprintf(msg, sizeof(msg), "row %u: %s", first_failed, first_why);
    Mapflow__V1__PutRegionCommitReply rep = MAPFLOW__V1__PUT_REGION_COMMIT_REPLY__INIT;
    rep.n_status = n;
    rep.status = status;
    rep.committed = ok;
    rep.replaced = replaced_n;
    rep.first_failed = first_failed < n ? first_failed : 0;
    rep.first_error = msg;
    rep.checked_on_gpu = on_gpu;
    mfd_metrics_observe(&s->metrics, MFD_H_PUT, mf_now_s() - t0);
    MFD_REPLY(c, rid, PUT_REGION_COMMIT_REPLY, put_region_commit_reply, &rep, NULL, 0);
    mfd_region_free(s, r);
    free(status);
    free(chk);
    free(piece);
}

void mfd_rows_region_abort(mfd_conn_t *c, uint64_t rid, const Mapflow__V1__PutRegionAbort *m)
{
    mfd_ticket_t *t = mfd_tickets_find(c->srv->tickets, m->region_id, MFD_TICKET_REGION, c);
    if (!t) {
        mfd_conn_error(c, rid, MF_NOT_FOUND,
                       "PutRegionAbort: region %llu is unknown, already committed or aborted, "
                       "expired, or another connection's", (unsigned long long)m->region_id);
        return;
    }
    mfd_ticket_release(t, c->srv);
    Mapflow__V1__PutRegionAbortReply rep = MAPFLOW__V1__PUT_REGION_ABORT_REPLY__INIT;
    MFD_REPLY(c, rid, PUT_REGION_ABORT_REPLY, put_region_abort_reply, &rep, NULL, 0);
}

/* ==== Lookup ========================================================================== */

/* The hit check of one (layer, block) that the block index does not vouch for: reads
 * the row (header, parent, tokens); a row only on the SSD tier counts as present (Get
 * verifies it when read). A row that passes marks its layer in the block index. */
static int lookup_row_hit(mfd_server_t *s, mfd_keys_tmpl_t *kt, uint32_t layer,
                          const mf_hash128_t *h, size_t b, const uint32_t *tok, uint32_t B,
                          const uint8_t parent[16])
{
    mfd_entry_t *e = mfd_store_find(&s->store, mfd_keys_tmpl_set(kt, layer, h[b + 1]));
    if (!e)
        return 0;
    const uint8_t *row = mfd_store_head(&s->store, e); /* a GPU-only row: its head copy */
    if (!row)
        return 1;
    const char *why = NULL;
    mf_status_t vs = mfd_row_verify(row, e->size, 0, tok, B, h[b], h[b + 1], &why);
    if (vs != MF_OK) {
        mfd_count(&s->metrics, vs == MF_NOT_FOUND ? MFD_C_HASH_MISMATCH : MFD_C_DATA_LOSS, 1);
        return 0;
    }
    mfd_index_block_note(s->store.ix, e, B, parent, tok);
    return 1;
}

/* Peers come from the configuration only: naming any other address would make this
 * daemon dial it and present its token there. */
static int peer_refused(mfd_conn_t *c, uint64_t rid, const char *what, const char *peer)
{
    if (mfd_config_peer_allowed(&c->srv->cfg, peer))
        return 0;
    mfd_count(&c->srv->metrics, MFD_C_ADMIN_DENIED, 1);
    mfd_debug("%s: %s names peer '%s', which is not in `peers`; refused", what, c->peer,
              peer);
    mfd_conn_error(c, rid, MF_PERMISSION_DENIED,
                   "%s: peer '%s' is not one of this daemon's configured peers", what, peer);
    return 1;
}

static void on_peer_lookup_done(mfd_conn_t *c, uint64_t rid, const Mapflow__V1__Lookup *m,
                                const uint8_t *payload, size_t plen, double t0,
                                const uint32_t *peer_blocks, size_t n_peer_blocks);

/* peer_blocks: the peer's answer (resume); via_peer: ask m->peer first. */
static void handle_lookup(mfd_conn_t *c, uint64_t rid, const Mapflow__V1__Lookup *m,
                          const uint8_t *payload, size_t plen, double t0, int via_peer,
                          const uint32_t *peer_blocks, size_t n_peer_blocks)
{
    mfd_server_t *s = c->srv;
    const char *why = NULL;
    if (mfd_keys_check_model_block(m->model, m->block_size, &why) != MF_OK) {
        mfd_conn_error(c, rid, MF_INVALID_ARGUMENT, "Lookup: %s", why);
        return;
    }
    if (m->n_layers < 1 || m->n_layers > s->cfg.max_batch) {
        mfd_conn_error(c, rid, MF_INVALID_ARGUMENT, "Lookup: %zu layers (want 1..%llu)",
                       m->n_layers, (unsigned long long)s->cfg.max_batch);
        return;
    }
    /* One request may hold the loop only so long: every (layer, block) is a probe (and
     * checked before a peer is asked to do the same work). */
    size_t nb_req = plen / 4 / m->block_size;
    if (nb_req > s->cfg.max_lookup || (uint64_t)nb_req * m->n_layers > s->cfg.max_lookup) {
        mfd_conn_error(c, rid, MF_INVALID_ARGUMENT,
                       "Lookup: %zu layers x %zu blocks exceed max_lookup %llu (split the "
                       "request)",
                       m->n_layers, nb_req, (unsigned long long)s->cfg.max_lookup);
        return;
    }
    if (via_peer && m->peer && m->peer[0]) {
        if (peer_refused(c, rid, "Lookup", m->peer))
            return;
        mfd_peers_lookup(c, rid, m, payload, plen, t0, on_peer_lookup_done);
        return;
    }
    uint32_t *tokens = NULL;
    mf_hash128_t *h = NULL;
    uint32_t *blocks = NULL, *alive = NULL;
    size_t n_tok;
    mf_status_t st = mfd_keys_tokens(payload, plen, &tokens, &n_tok, &why);
    if (st != MF_OK) {
        mfd_conn_error(c, rid, st, "Lookup: %s", why);
        return;
    }
    uint32_t B = m->block_size;
    size_t nb = n_tok / B;
    blocks = calloc(m->n_layers, sizeof(*blocks));
    alive = malloc(m->n_layers * sizeof(*alive));
    if (!blocks || !alive || mfd_keys_prefix_hashes(c, m->model, B, tokens, nb, &h) != MF_OK) {
        mfd_conn_error(c, rid, MF_RESOURCE_EXHAUSTED, "Lookup: out of memory");
        goto done;
    }
    uint64_t hit_blocks = 0;
    mfd_keys_tmpl_t kt;
    mfd_keys_tmpl_init(&kt, c, m->model);
    /* Blocks outer, layers inner: one block-index probe and one token compare per block;
     * a layer leaves `alive` at its first miss (only leading blocks count). */
    uint8_t bk[MFD_BKEY_MAX], parent[16];
    memcpy(bk, kt.k.b, kt.at);
    mf_hash_to_le(h[0], parent);
    size_t n_alive = m->n_layers;
    for (size_t l = 0; l < n_alive; l++)
        alive[l] = (uint32_t)l;
    for (size_t b = 0; b < nb && n_alive; b++) {
        if (b)
            memcpy(parent, bk + kt.at, 16); /* block b's parent is block b - 1's hash */
        mf_hash_to_le(h[b + 1], bk + kt.at);
        const mfd_block_t *blk = mfd_index_block_find(s->store.ix, bk, kt.at + 16);
        if (!blk)
            break;
        const uint32_t *tok = tokens + b * B;
        int match = mfd_block_matches(blk, B, parent, tok);
        size_t keep = 0;
        for (size_t i = 0; i < n_alive; i++) {
            uint32_t l = alive[i];
            int hit;
            if (mfd_block_has_layer(blk, m->layers[l])) {
                hit = match; /* the row carries the block's record: no need to read it */
                if (!match)
                    mfd_count(&s->metrics, MFD_C_HASH_MISMATCH, 1);
            } else {
                hit = lookup_row_hit(s, &kt, m->layers[l], h, b, tok, B, parent);
            }
            if (hit) {
                blocks[l]++;
                alive[keep++] = l;
            }
        }
        n_alive = keep;
    }
    for (size_t l = 0; l < m->n_layers; l++) {
        if (peer_blocks && l < n_peer_blocks && peer_blocks[l] > blocks[l])
            blocks[l] = peer_blocks[l] < nb ? peer_blocks[l] : (uint32_t)nb;
        hit_blocks += blocks[l];
    }
    mfd_count(&s->metrics, MFD_C_LOOKUP_REQ_TOKENS, (uint64_t)m->n_layers * nb * B);
    mfd_count(&s->metrics, MFD_C_LOOKUP_HIT_TOKENS, hit_blocks * B);
    Mapflow__V1__LookupReply rep = MAPFLOW__V1__LOOKUP_REPLY__INIT;
    rep.n_blocks = m->n_layers;
    rep.blocks = blocks;
    rep.total_blocks = (uint32_t)nb;
    mfd_metrics_observe(&s->metrics, MFD_H_LOOKUP, mf_now_s() - t0);
    MFD_REPLY(c, rid, LOOKUP_REPLY, lookup_reply, &rep, NULL, 0);
done:
    free(alive);
    free(blocks);
    free(h);
    free(tokens);
}

/* The peer answered (peer_blocks) or could not (NULL): the Lookup runs here, once. */
static void on_peer_lookup_done(mfd_conn_t *c, uint64_t rid, const Mapflow__V1__Lookup *m,
                                const uint8_t *payload, size_t plen, double t0,
                                const uint32_t *peer_blocks, size_t n_peer_blocks)
{
    if (!c->dead)
        handle_lookup(c, rid, m, payload, plen, t0, 0, peer_blocks, n_peer_blocks);
}

void mfd_rows_lookup(mfd_conn_t *c, uint64_t rid, const Mapflow__V1__Lookup *m,
                     const uint8_t *payload, size_t plen, double t0)
{
    handle_lookup(c, rid, m, payload, plen, t0, 1, NULL, 0);
}

/* ==== Get ============================================================================= */

typedef struct get_op get_op_t;

typedef struct get_row {
    get_op_t *op;
    mfd_entry_t *e;          /* pinned while the op holds it (NULL: not found) */
    uint32_t block_rel;      /* index into the op's hash / token arrays (prefix mode) */
    int vouched;             /* prefix lease: the block index vouches for the row's parent
                              * and tokens, so its bytes are not read for the hit check */
    const uint8_t *src;      /* copy mode, status OK: the verified bytes to send */
    uint8_t *buf;            /* copy mode: bytes this row owns (SSD read, demotion copy) */
    Mapflow__V1__RowRef ref;
} get_row_t;

struct get_op {
    mfd_conn_t *c;
    uint64_t rid;
    int lease_mode, prefix_mode;
    uint64_t gpu_mapped;     /* GPU arenas the client opened (leases may point into them) */
    uint32_t B;
    uint32_t *tokens;        /* prefix mode: all tokens */
    mf_hash128_t *h;         /* h[0] = root, h[b + 1] = block b */
    uint32_t first, nb;      /* prefix mode: blocks [first, first + nb) of each layer */
    mfd_keys_tmpl_t kt;           /* prefix mode: (namespace, model) key */
    size_t n_rows, outstanding;
    get_row_t *rows;
    double t0;
    uint64_t now_ms;         /* get_run: the rows' access time (one clock read per Get) */
};

static void get_op_free(get_op_t *op)
{
    /* rows is NULL when the request failed its bounds checks (n_rows may be huge). */
    for (size_t i = 0; op->rows && i < op->n_rows; i++) {
        if (op->rows[i].e)
            mfd_index_unpin(op->c->srv->store.ix, op->rows[i].e);
        free(op->rows[i].buf);
    }
    free(op->rows);
    free(op->tokens);
    free(op->h);
    free(op);
}

/* Checks one row's bytes against the request; the caller set ref.status = OK first.
 * Every row here was validated in full when it was committed or read from the SSD
 * tier, so this is the hit check (header, parent, hash, tokens), not a checksum: the
 * client library checks the checksum of what it receives. */
static void verify_row(get_op_t *op, get_row_t *r, const uint8_t *bytes)
{
    const char *why = NULL;
    mf_status_t st;
    if (op->prefix_mode) {
        uint32_t b = r->block_rel;
        const uint32_t *tok = op->tokens + (size_t)b * op->B;
        st = mfd_row_verify(bytes, r->e->size, 0, tok, op->B, op->h[b], op->h[b + 1], &why);
        if (st == MF_OK) { /* the next Get of this row is vouched for by its block */
            uint8_t parent[16];
            mf_hash_to_le(op->h[b], parent);
            mfd_index_block_note(op->c->srv->store.ix, r->e, op->B, parent, tok);
        }
    } else {
        st = mfd_row_verify(bytes, r->e->size, 0, NULL, 0, (mf_hash128_t){0, 0},
                            (mf_hash128_t){0, 0}, &why);
    }
    if (st != MF_OK) {
        /* NOT_FOUND: a collision — another context's row, never handed out as this one. */
        mfd_count(&op->c->srv->metrics,
                  st == MF_NOT_FOUND ? MFD_C_HASH_MISMATCH : MFD_C_DATA_LOSS, 1);
        mfd_debug("get: layer %u block %u: %s", r->ref.layer, r->ref.block, why ? why : "");
        r->ref.status = st;
    }
}

/* Block j of a prefix Get is verified when its block-index record (made from a row
 * validated at commit or read back) carries the request's parent and tokens. A block
 * known only from the SSD index has no record yet: one is made from a row of a requested
 * layer that is in memory, if any (else the block stays unverified). A block of the Get's
 * own range of which no row is stored here breaks the chain (issue 22): nothing here
 * could tell the request's block j from a colliding context's, whose later blocks carry
 * exactly the request's parents and tokens. A block before the range (first_block > 0)
 * that is stored nowhere here does not: a range Get is how a caller asks for the tail of
 * a prefix whose head it has (its own cache, or rows read through from a peer, which
 * fetches the range only); proto/README.md says what that leaves open. */
static int block_verified(get_op_t *op, size_t n_layers, uint32_t j)
{
    mfd_store_t *st = &op->c->srv->store;
    uint8_t parent[16], bk[MFD_BKEY_MAX];
    mf_hash_to_le(op->h[j], parent);
    const uint32_t *tok = op->tokens + (size_t)j * op->B;
    const mfd_key_t *k = mfd_keys_tmpl_set(&op->kt, op->rows[0].ref.layer, op->h[j + 1]);
    const mfd_block_t *b = mfd_index_block_find(st->ix, bk, mfd_bkey_of(k->b, k->len, bk));
    if (!b)
        return j < op->first;
    if (mfd_block_matches(b, op->B, parent, tok))
        return 1;
    for (size_t l = 0; l < n_layers; l++) {
        uint32_t layer = op->rows[l * op->nb].ref.layer;
        mfd_entry_t *e = mfd_index_block_entry(st->ix, b, layer,
                                               mfd_keys_tmpl_set(&op->kt, layer, op->h[j + 1]));
        const uint8_t *row = e ? mfd_store_head(st, e) : NULL;
        const char *why;
        if (row && mfd_row_verify(row, e->size, 0, tok, op->B, op->h[j], op->h[j + 1], &why) ==
                       MF_OK) {
            mfd_index_block_note(st->ix, e, op->B, parent, tok); /* records only if unrecorded */
            /* Only the record's context is verified: rows of two contexts under one block
             * (a collision) leave the later blocks' rows to the one that recorded it. */
            return mfd_block_matches(b, op->B, parent, tok);
        }
    }
    return 0;
}

/* A hit at block i needs blocks 0..i-1 of the request verified too (DESIGN §4; issue 22):
 * a block-0 collision would otherwise make every later block of the other context (same
 * parent hash, same tokens) hit. Rows past the first block whose stored rows do not vouch
 * for the request become NOT_FOUND. */
static void verify_chain(get_op_t *op)
{
    if (!op->prefix_mode || !op->nb)
        return;
    size_t n_layers = op->n_rows / op->nb;
    uint32_t last = op->first + op->nb - 1, ok = 0; /* blocks [0, ok) verified */
    while (ok < last && block_verified(op, n_layers, ok))
        ok++;
    /* A break at a block of the range whose rows a peer could not deliver may heal on a
     * retry: its later rows are UNAVAILABLE like it, not NOT_FOUND. */
    mf_status_t cut = MF_NOT_FOUND;
    for (size_t l = 0; ok >= op->first && ok < last && l < n_layers; l++)
        if (op->rows[l * op->nb + (ok - op->first)].ref.status == MF_UNAVAILABLE)
            cut = MF_UNAVAILABLE;
    for (size_t i = 0; i < op->n_rows; i++) {
        get_row_t *r = &op->rows[i];
        if (r->ref.status == MF_OK && r->block_rel > ok) {
            r->ref.status = cut;
            mfd_count(&op->c->srv->metrics, MFD_C_HASH_MISMATCH, cut == MF_NOT_FOUND);
        }
    }
}


/* A leased row's offset in the arena its tier names (an SSD row was read into the host
 * arena). Taken as the row is resolved, while its block is in cache; the entry is pinned,
 * so the block does not move before the lease is granted. */
static void set_lease_offset(get_row_t *r)
{
    r->ref.arena_offset = mfd_ablock_offset(
        r->ref.tier == MAPFLOW__V1__TIER__TIER_GPU ? r->e->gpu : r->e->host);
}

/* One lease group for every row of the Get that is OK (ids: group << MFD_LEASE_ROW_BITS | k). */
static void grant_leases(get_op_t *op)
{
    mfd_server_t *s = op->c->srv;
    uint32_t n = 0;
    for (size_t i = 0; i < op->n_rows; i++)
        n += op->rows[i].ref.status == MF_OK;
    if (!n)
        return;
    mfd_lease_t *l = op->c->dead ? NULL : calloc(1, sizeof(*l) + n * sizeof(l->e[0]));
    for (size_t i = 0; i < op->n_rows; i++) {
        get_row_t *r = &op->rows[i];
        if (r->ref.status != MF_OK)
            continue;
        if (!l) {
            r->ref.status = op->c->dead ? MF_CANCELLED : MF_RESOURCE_EXHAUSTED;
            continue;
        }
        uint32_t k = l->n++;
        l->e[k] = r->e;
        r->e->leases++; /* ref.arena_offset: set_lease_offset, when the row was resolved */
        r->e = NULL;    /* the op's pin (get_find_rows) becomes the lease's */
    }
    if (!l)
        return;
    l->live = l->n;
    s->leased_rows += l->n;
    mfd_tickets_add(s->tickets, &l->t, MFD_TICKET_LEASE, op->c,
                    (uint64_t)mf_now_ms() + s->cfg.lease_ttl_ms);
    for (size_t i = 0, k = 0; i < op->n_rows; i++)
        if (op->rows[i].ref.status == MF_OK)
            op->rows[i].ref.lease_id = (l->t.id << MFD_LEASE_ROW_BITS) | k++;
    mfd_count(&s->metrics, MFD_C_LEASES_GRANTED, l->n);
}

/* A row referenced by a reply buffer: its pin goes when libevent is done with it. */
typedef struct row_pin {
    mfd_store_t *st;
    mfd_entry_t *e;
} row_pin_t;

static void on_row_sent(const void *data, size_t len, void *arg)
{
    (void)data;
    (void)len;
    row_pin_t *p = arg;
    mfd_index_unpin(p->st->ix, p->e);
    free(p);
}

static void on_buf_sent(const void *data, size_t len, void *arg)
{
    (void)len;
    (void)arg;
    free((void *)data);
}

/* Rows at least this large go out by reference (no copy into the evbuffer). */
#define REF_MIN_BYTES (64u << 10)

/* Appends a copy-mode row to the reply: a reference to the host block (the op's pin
 * moves to the buffer) or to the row's own buffer, or a copy when small. */
static int add_row_bytes(struct evbuffer *out, mfd_store_t *st, get_row_t *r)
{
    size_t len = r->ref.length;
    if (len < REF_MIN_BYTES)
        return evbuffer_add(out, r->src, len);
    if (r->buf) {
        if (evbuffer_add_reference(out, r->buf, len, on_buf_sent, NULL) != 0)
            return -1;
        r->buf = NULL;
        return 0;
    }
    row_pin_t *p = malloc(sizeof(*p));
    if (!p || evbuffer_add_reference(out, r->src, len, on_row_sent, p) != 0) {
        free(p);
        return evbuffer_add(out, r->src, len);
    }
    *p = (row_pin_t){st, r->e};
    r->e = NULL;
    return 0;
}

/* Sends a copy-mode GetReply: the OK rows packed 16-byte aligned, in row order. */
static void reply_get_copy(get_op_t *op, mf_envelope_t *env, size_t plen)
{
    mfd_conn_t *c = op->c;
    if (c->dead)
        return;
    uint8_t *head;
    size_t hlen;
    if (mf_frame_encode_head(env, plen, (uint32_t)c->srv->cfg.max_frame, &head, &hlen) != MF_OK) {
        mfd_error("connection %s: get reply of %zu payload bytes does not fit max_frame",
                  c->peer, plen);
        mfd_conn_error(c, op->rid, MF_INTERNAL, "reply exceeds max_frame");
        return;
    }
    /* Built aside, so a failure midway never leaves half a frame in c->out. */
    struct evbuffer *f = evbuffer_new();
    static const uint8_t zeros[MF_ROW_ALIGN];
    int bad = !f || evbuffer_add(f, head, hlen) != 0;
    free(head);
    size_t off = 0;
    for (size_t i = 0; !bad && i < op->n_rows; i++) {
        get_row_t *r = &op->rows[i];
        if (r->ref.status != MF_OK)
            continue;
        bad = evbuffer_add(f, zeros, r->ref.payload_offset - off) != 0 ||
              add_row_bytes(f, &c->srv->store, r) != 0;
        off = r->ref.payload_offset + r->ref.length;
    }
    if (bad) {
        if (f)
            evbuffer_free(f);
        mfd_conn_error(c, op->rid, MF_RESOURCE_EXHAUSTED, "Get: out of memory");
        return;
    }
    evbuffer_add_buffer(c->out, f);
    evbuffer_free(f);
    mfd_conn_flush(c);
}

static void finish_get(get_op_t *op)
{
    mfd_server_t *s = op->c->srv;
    verify_chain(op);
    if (op->lease_mode)
        grant_leases(op);
    Mapflow__V1__RowRef **refs = malloc(op->n_rows * sizeof(*refs));
    size_t end = 0;
    uint64_t B = op->prefix_mode ? op->B : 0;
    for (size_t i = 0; i < op->n_rows; i++) {
        Mapflow__V1__RowRef *ref = &op->rows[i].ref;
        if (refs)
            refs[i] = ref;
        if (ref->status == MF_OK) {
            /* Copy mode: packed now, so failed rows leave no gap to zero. */
            if (!op->lease_mode) {
                ref->payload_offset = (end + MF_ROW_ALIGN - 1) & ~(size_t)(MF_ROW_ALIGN - 1);
                end = ref->payload_offset + ref->length;
            }
            mfd_count(&s->metrics,
                      ref->tier == MAPFLOW__V1__TIER__TIER_SSD   ? MFD_C_GET_HIT_TOKENS_SSD
                      : ref->tier == MAPFLOW__V1__TIER__TIER_GPU ? MFD_C_GET_HIT_TOKENS_GPU
                                                                 : MFD_C_GET_HIT_TOKENS_HOST,
                      B);
        } else {
            ref->payload_offset = 0;
            if (ref->status != MF_NOT_FOUND)
                mfd_metrics_error(&s->metrics, (mf_status_t)ref->status);
            mfd_count(&s->metrics, MFD_C_GET_MISS_TOKENS, B);
        }
    }
    mfd_count(&s->metrics, MFD_C_GET_REQ_TOKENS, B * op->n_rows);
    if (!refs) {
        mfd_conn_error(op->c, op->rid, MF_RESOURCE_EXHAUSTED, "Get: out of memory");
    } else {
        Mapflow__V1__GetReply rep = MAPFLOW__V1__GET_REPLY__INIT;
        rep.n_rows = op->n_rows;
        rep.rows = refs;
        rep.lease_ttl_ms = op->lease_mode ? s->cfg.lease_ttl_ms : 0;
        mfd_metrics_observe(&s->metrics, MFD_H_GET, mf_now_s() - op->t0);
        mf_envelope_t env = MAPFLOW__V1__ENVELOPE__INIT;
        env.request_id = op->rid;
        env.body_case = MAPFLOW__V1__ENVELOPE__BODY_GET_REPLY;
        env.get_reply = &rep;
        if (op->lease_mode)
            mfd_conn_reply(op->c, &env, NULL, 0);
        else
            reply_get_copy(op, &env, end);
    }
    free(refs);
    get_op_free(op);
}

static void on_get_read(void *arg, mfd_entry_t *e, mf_status_t st, uint8_t *buf, size_t len)
{
    get_row_t *r = arg;
    get_op_t *op = r->op;
    const uint8_t *bytes = buf ? buf : e->host ? mfd_store_bytes(&op->c->srv->store, e) : NULL;
    if (st != MF_OK) {
        r->ref.status = st == MF_DATA_LOSS ? MF_DATA_LOSS : st == MF_NOT_FOUND ? MF_NOT_FOUND
                                                                              : MF_UNAVAILABLE;
    } else if (op->lease_mode && (!e->host || !e->linked)) {
        r->ref.status = MF_RESOURCE_EXHAUSTED; /* no room to promote it for a lease */
    } else if (!bytes || len != r->ref.length) {
        r->ref.status = MF_DATA_LOSS;
    } else {
        /* The store checked the checksum as it read the row. */
        r->ref.tier = MAPFLOW__V1__TIER__TIER_SSD;
        verify_row(op, r, bytes);
        if (r->ref.status == MF_OK && op->lease_mode)
            set_lease_offset(r);
        else if (r->ref.status == MF_OK) {
            r->src = bytes;
            r->buf = buf;
            buf = NULL;
        }
    }
    free(buf);
    mfd_conn_t *c = op->c;
    if (--op->outstanding == 0) {
        finish_get(op);
        mfd_conn_unhold(c);
    }
}

/* Resolves row r now, or starts its SSD read. */
static void resolve_row(get_op_t *op, get_row_t *r)
{
    mfd_server_t *s = op->c->srv;
    mfd_entry_t *e = r->e;
    mfd_store_touch_at(&s->store, e, op->now_ms);
    if (!op->lease_mode && r->ref.status != MF_OK)
        return; /* OUT_OF_RANGE: no room in this reply */
    mfd_view_t v;
    mf_status_t st = mfd_store_view(&s->store, e, op->lease_mode, op->gpu_mapped, &v);
    if (st != MF_OK) {
        r->ref.status = st;
        return;
    }
    if (v.need_read) {
        op->outstanding++;
        mfd_store_read(&s->store, e, 1, on_get_read, r);
        return;
    }
    r->ref.tier = v.tier;
    if (op->lease_mode && v.tier == MAPFLOW__V1__TIER__TIER_GPU)
        r->ref.gpu_arena = v.gpu_arena;
    r->buf = v.owned; /* freed with the op unless the reply takes it */
    if (!r->vouched)
        verify_row(op, r, v.bytes);
    if (r->ref.status == MF_OK && op->lease_mode)
        set_lease_offset(r);
    else if (r->ref.status == MF_OK)
        r->src = v.bytes;
    /* gpu_promote: a host hit gets a GPU copy (a lease's even when its check failed). */
    if (v.tier == MAPFLOW__V1__TIER__TIER_HOST && (op->lease_mode || r->ref.status == MF_OK))
        mfd_store_promote_gpu(&s->store, e);
}

/* A prefix Get's blocks, looked up once each: the block node (NULL: no row of the block
 * is stored) and whether its record carries the request's parent and tokens. Valid only
 * within the loop callback that made it (nodes go with their last entry). */
typedef struct get_block {
    const mfd_block_t *node;
    int match;
} get_block_t;

/* blks[b] for blocks [first, first + nb) of the request. */
static void get_find_blocks(get_op_t *op, get_block_t *blks)
{
    mfd_index_t *ix = op->c->srv->store.ix;
    mfd_keys_tmpl_t *kt = &op->kt;
    uint8_t bk[MFD_BKEY_MAX], parent[16];
    memcpy(bk, kt->k.b, kt->at); /* the block key: the entry key without its layer */
    for (uint32_t b = 0; b < op->nb; b++) {
        uint32_t j = op->first + b;
        mf_hash_to_le(op->h[j + 1], bk + kt->at);
        mf_hash_to_le(op->h[j], parent);
        blks[b].node = mfd_index_block_find(ix, bk, kt->at + 16);
        blks[b].match = blks[b].node &&
                        mfd_block_matches(blks[b].node, op->B, parent,
                                          op->tokens + (size_t)j * op->B);
    }
}

/* Pass 1: finds (and pins) each row's entry, lays the copy payload out (bounded by
 * max_frame). A prefix Get finds its rows through their blocks (one block probe and one
 * token compare per block, then the layers' rows from the block node). A lease of a row
 * whose layer the matching block vouches for (its row, validated at commit or read back,
 * carries the block's record) skips reading the row: the client reads the arena itself,
 * later, and checks header and tokens of what it reads (a check here could not cover
 * a same-node writer changing the shared arena after it anyway). A copy is still
 * checked here, since these are the bytes the reply carries.
 * forced: NULL on the first pass; after a peer fetch, the peer's status of each row
 * (0: none), given to rows still missing here. */
static void get_find_rows(get_op_t *op, const Mapflow__V1__Get *m, const mf_status_t *forced)
{
    mfd_server_t *s = op->c->srv;
    size_t budget = s->cfg.max_frame - 4 - 256 - op->n_rows * 64;
    size_t off = 0;
    mfd_keys_tmpl_t *kt = &op->kt;
    const char *why = NULL;
    get_block_t *blks = NULL;
    if (op->prefix_mode && op->nb) {
        blks = malloc(op->nb * sizeof(*blks));
        if (blks)
            get_find_blocks(op, blks);
    }
    for (size_t i = 0; i < op->n_rows; i++) {
        get_row_t *r = &op->rows[i];
        mapflow__v1__row_ref__init(&r->ref);
        r->op = op;
        r->vouched = 0;
        mfd_key_t k;
        if (op->prefix_mode) {
            size_t l = i / op->nb, b = i % op->nb;
            uint32_t layer = m->layers[l];
            r->block_rel = (uint32_t)(m->first_block + b);
            r->ref.layer = layer;
            r->ref.block = r->block_rel;
            const mfd_key_t *kp = mfd_keys_tmpl_set(kt, layer, op->h[r->block_rel + 1]);
            if (blks) {
                r->e = mfd_index_block_entry(s->store.ix, blks[b].node, layer, kp);
                r->vouched = op->lease_mode && r->e && blks[b].match &&
                             mfd_block_has_layer(blks[b].node, layer);
            } else {
                r->e = mfd_store_find(&s->store, kp); /* out of memory: row by row */
            }
        } else if (mfd_keys_from_msg(op->c, m->keys[i], &k, &why) != MF_OK) {
            r->ref.status = MF_INVALID_ARGUMENT;
            continue;
        } else {
            r->ref.layer = m->keys[i]->layer;
            r->e = mfd_store_find(&s->store, &k);
        }
        if (!r->e) {
            r->ref.status = forced && forced[i] ? forced[i] : MF_NOT_FOUND;
            continue;
        }
        mfd_entry_pin(r->e);
        if (!op->prefix_mode)
            r->ref.block = r->e->block;
        r->ref.status = MF_OK;
        r->ref.length = r->e->size;
        if (!op->lease_mode) {
            size_t at = (off + MF_ROW_ALIGN - 1) & ~(size_t)(MF_ROW_ALIGN - 1);
            if (at + r->e->size > budget) {
                r->ref.status = MF_OUT_OF_RANGE;
            } else {
                r->ref.payload_offset = at;
                off = at + r->e->size;
            }
        }
    }
    free(blks);
}

/* Pass 2: copy / lease what is in memory, read the rest from the SSD tier. */
static void get_run(get_op_t *op)
{
    mfd_conn_t *c = op->c;
    op->outstanding = 1; /* held by this function until every row has started */
    op->now_ms = (uint64_t)mf_now_ms();
    mfd_conn_hold(c);
    for (size_t i = 0; i < op->n_rows; i++) {
        /* The arena block of a row a few ahead: set_lease_offset's read of it is otherwise
         * a cache miss per row (blocks are separate allocations). */
        const mfd_entry_t *ahead = i + 8 < op->n_rows ? op->rows[i + 8].e : NULL;
        if (ahead)
            __builtin_prefetch(ahead->gpu ? (const void *)ahead->gpu : (const void *)ahead->host);
        if (op->rows[i].e && (op->rows[i].ref.status == MF_OK ||
                              op->rows[i].ref.status == MF_OUT_OF_RANGE))
            resolve_row(op, &op->rows[i]);
    }
    if (--op->outstanding == 0) {
        finish_get(op);
        mfd_conn_unhold(c);
    }
}

/* The peer fetch is over (mfd_peer_get_done): rows it committed are here now. The op
 * finds its rows again (its pins were dropped while it waited, so a slow peer never
 * holds memory here) and finishes. */
static void on_peer_get_done(void *arg, const Mapflow__V1__Get *m, const mf_status_t *forced)
{
    get_op_t *op = arg;
    if (!m || op->c->dead) {
        get_op_free(op);
        return;
    }
    get_find_rows(op, m, forced);
    get_run(op);
}

/* Unpins every row (the op waits for a peer; get_find_rows pins again). */
static void get_unpin_rows(get_op_t *op)
{
    for (size_t i = 0; i < op->n_rows; i++) {
        if (op->rows[i].e)
            mfd_index_unpin(op->c->srv->store.ix, op->rows[i].e);
        op->rows[i].e = NULL;
    }
}

void mfd_rows_get(mfd_conn_t *c, uint64_t rid, const Mapflow__V1__Get *m,
                  const uint8_t *payload, size_t plen, double t0)
{
    mfd_server_t *s = c->srv;
    const char *why = NULL;
    get_op_t *op = calloc(1, sizeof(*op));
    if (!op) {
        mfd_conn_error(c, rid, MF_RESOURCE_EXHAUSTED, "Get: out of memory");
        return;
    }
    op->c = c;
    op->rid = rid;
    op->t0 = t0;
    op->lease_mode = m->mode == MAPFLOW__V1__GET_MODE__GET_LEASE;
    op->prefix_mode = m->n_keys == 0;
    op->gpu_mapped = gpu_mask(c, m->gpu_mapped);
    if (op->lease_mode && !c->has_arena) {
        mfd_conn_error(c, rid, MF_FAILED_PRECONDITION,
                       "Get: GET_LEASE needs the host arena (unix socket, Hello.want_host_arena)");
        goto fail;
    }
    if (m->peer && m->peer[0] && peer_refused(c, rid, "Get", m->peer))
        goto fail;
    size_t n_blocks = 0;
    if (op->prefix_mode) {
        if (mfd_keys_check_model_block(m->model, m->block_size, &why) != MF_OK) {
            mfd_conn_error(c, rid, MF_INVALID_ARGUMENT, "Get: %s", why);
            goto fail;
        }
        size_t n_tok;
        mf_status_t st = mfd_keys_tokens(payload, plen, &op->tokens, &n_tok, &why);
        if (st != MF_OK) {
            mfd_conn_error(c, rid, st, "Get: %s", why);
            goto fail;
        }
        op->B = m->block_size;
        size_t total = n_tok / op->B;
        if (m->first_block > total || (m->n_blocks && m->first_block + (uint64_t)m->n_blocks > total)) {
            mfd_conn_error(c, rid, MF_INVALID_ARGUMENT,
                           "Get: tokens hold %zu full blocks, fewer than first_block %u + n_blocks %u",
                           total, m->first_block, m->n_blocks);
            goto fail;
        }
        n_blocks = m->n_blocks ? m->n_blocks : total - m->first_block;
        if (m->n_layers == 0) {
            mfd_conn_error(c, rid, MF_INVALID_ARGUMENT, "Get: no layers");
            goto fail;
        }
        op->n_rows = m->n_layers * n_blocks;
        if (n_blocks && op->n_rows / n_blocks != m->n_layers)
            op->n_rows = SIZE_MAX;
    } else {
        op->n_rows = m->n_keys;
    }
    if (op->n_rows > s->cfg.max_batch) {
        mfd_conn_error(c, rid, MF_INVALID_ARGUMENT, "Get: %zu rows exceed max_batch %llu",
                       op->n_rows, (unsigned long long)s->cfg.max_batch);
        goto fail;
    }
    if (op->prefix_mode) {
        /* Hashes of blocks [0, first_block + n_blocks): the chain starts at block 0. */
        size_t upto = m->first_block + n_blocks;
        if (upto > s->cfg.max_lookup) {
            mfd_conn_error(c, rid, MF_INVALID_ARGUMENT,
                           "Get: %zu blocks to hash exceed max_lookup %llu", upto,
                           (unsigned long long)s->cfg.max_lookup);
            goto fail;
        }
        if (mfd_keys_prefix_hashes(c, m->model, op->B, op->tokens, upto, &op->h) != MF_OK) {
            mfd_conn_error(c, rid, MF_RESOURCE_EXHAUSTED, "Get: out of memory");
            goto fail;
        }
    }
    op->rows = calloc(op->n_rows ? op->n_rows : 1, sizeof(*op->rows));
    if (!op->rows) {
        mfd_conn_error(c, rid, MF_RESOURCE_EXHAUSTED, "Get: out of memory");
        goto fail;
    }
    if (op->prefix_mode) {
        mfd_keys_tmpl_init(&op->kt, c, m->model);
        op->first = m->first_block;
        op->nb = (uint32_t)n_blocks;
    }
    get_find_rows(op, m, NULL);
    if (m->peer && m->peer[0]) {
        /* Read-through: the peer fills in what is missing, then this op resumes. */
        uint32_t *miss = malloc(op->n_rows * sizeof(*miss) + 1);
        size_t n_miss = 0;
        for (size_t i = 0; miss && i < op->n_rows; i++)
            if (!op->rows[i].e && op->rows[i].ref.status == MF_NOT_FOUND)
                miss[n_miss++] = (uint32_t)i;
        if (!miss)
            mfd_conn_error(c, rid, MF_RESOURCE_EXHAUSTED, "Get: out of memory");
        if (miss && n_miss) {
            get_unpin_rows(op);
            mfd_peers_get(c, rid, m, payload, plen, t0, miss, n_miss, on_peer_get_done, op);
        }
        free(miss);
        if (!miss) {
            get_op_free(op);
            return;
        }
        if (n_miss)
            return;
    }
    get_run(op);
    return;
fail:
    get_op_free(op);
}

void mfd_rows_release(mfd_conn_t *c, uint64_t rid, const Mapflow__V1__Release *m)
{
    mfd_server_t *s = c->srv;
    uint32_t n = 0;
    mfd_lease_t *l = NULL; /* the last group found: a Get's ids come together */
    for (size_t i = 0; i < m->n_lease_ids; i++) {
        uint64_t gid = m->lease_ids[i] >> MFD_LEASE_ROW_BITS;
        uint64_t k = m->lease_ids[i] & ((1u << MFD_LEASE_ROW_BITS) - 1);
        if (!l || l->t.id != gid)
            l = (mfd_lease_t *)mfd_tickets_find(s->tickets, gid, MFD_TICKET_LEASE, c);
        if (!l || k >= l->n || !l->e[k])
            continue;
        mfd_lease_drop_row(s, l, (uint32_t)k);
        n++;
        if (l->live == 0) {
            mfd_tickets_remove(s->tickets, &l->t);
            free(l);
            l = NULL;
        }
    }
    Mapflow__V1__ReleaseReply rep = MAPFLOW__V1__RELEASE_REPLY__INIT;
    rep.released = n;
    MFD_REPLY(c, rid, RELEASE_REPLY, release_reply, &rep, NULL, 0);
}
