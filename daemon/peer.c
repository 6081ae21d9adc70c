/* peer — UCX serving hooks, fetches, read-through and Lookup through peers, lifecycle
 * (see peer.h); the links themselves are peer_link.c's. */
#include "peer.h"
#include "peer_link.h"
#include "mf_clock.h"
#include "log.h"
#include "mf_addr.h"
#include "conn.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

const mfd_transport_t mfd_transport_ucx = {"ucx", 1, 0};

#define LINK_SWEEP_MS 250

/* ==== UCX context ====================================================================== */

static mf_status_t adopt(void *arg, int fd, const char *name)
{
    return mfd_conn_adopt(arg, fd, &mfd_transport_ucx, name, NULL);
}

static mf_status_t ensure_ucx(mfd_peers_t *ps, const char *listen, char *err, size_t errlen)
{
    if (ps->ucx)
        return MF_OK;
    mfd_ucx_params_t p = {0};
    p.field_mask = MFD_UCX_P_MAX_FRAME;
    p.base = ps->base;
    p.max_frame = ps->max_frame;
    if (ps->srv) {
        p.field_mask |= MFD_UCX_P_ARENA;
        p.arena = mfd_store_host_base(&ps->srv->store);
        p.arena_bytes = mfd_store_host_capacity(&ps->srv->store);
    }
    if (listen) {
        p.field_mask |= MFD_UCX_P_LISTEN;
        p.listen = listen;
        p.adopt = adopt;
        p.adopt_arg = ps->srv;
    }
    return mfd_ucx_create(&p, &ps->ucx, err, errlen);
}

mfd_ucx_t *mfd_peers_ucx(const mfd_peers_t *ps)
{
    return ps ? ps->ucx : NULL;
}

/* A link to addr for namespace ns, the UCX context created first when none is yet. */
static link_t *link_open(mfd_peers_t *ps, const char *addr, const char *ns, char *err,
                         size_t errlen, mf_status_t *st)
{
    if ((*st = ensure_ucx(ps, NULL, err, errlen)) != MF_OK)
        return NULL;
    return mfd_link_get(ps, addr, ns, err, errlen, st);
}

/* ==== fetch: leases at the peer, pipelined one-sided gets, release ======================= */

typedef struct fetch fetch_t;

typedef struct fsink {
    /* Where row i (len bytes) goes; an error fails the row. */
    mf_status_t (*place)(fetch_t *f, size_t i, uint64_t len, uint8_t **dst);
    /* Row i is over: its bytes arrived (st OK) or it failed; returns the final status. */
    mf_status_t (*row_done)(fetch_t *f, size_t i, mf_status_t st);
    void (*all_done)(fetch_t *f);
} fsink_t;

typedef struct frow {
    uint32_t layer;
    uint8_t hash[16];
    mf_status_t st;
    uint64_t lease, off, len, issued;
    uint8_t *dst;
    unsigned inflight;
    int finished;
} frow_t;

typedef struct chunk {
    fetch_t *f;
    size_t row;
    size_t len;
} chunk_t;

struct fetch {
    mfd_peers_t *ps;
    link_t *l;
    char model[MFD_MODEL_MAX + 1];
    frow_t *rows;
    size_t n, unfinished, cursor, batches_out;
    unsigned inflight;
    uint64_t ttl_ms;
    struct event *timer;
    double t0;
    const fsink_t *sink;
    void *ctx;               /* the sink's own state */
    int released;
};

static void fetch_check_done(fetch_t *f);
static void fetch_pump(fetch_t *f);

static void row_finish(fetch_t *f, size_t i)
{
    frow_t *r = &f->rows[i];
    if (r->finished)
        return;
    r->finished = 1;
    f->unfinished--;
    r->st = f->sink->row_done(f, i, r->st);
    if (r->st == MF_OK) {
        f->l->stat->rows++;
        f->l->stat->bytes += r->len;
        f->ps->fetch_rows++;
        f->ps->fetch_bytes += r->len;
    } else if (r->st != MF_NOT_FOUND) {
        f->l->stat->errors++;
    }
}

static void on_release_reply(void *arg, mf_status_t st, const char *why,
                             const mf_envelope_t *env, const mf_frame_t *fr)
{
    (void)arg;
    (void)env;
    (void)fr;
    if (st != MF_OK)
        mfd_debug("peer: Release: %s: %s", mf_status_name(st), why ? why : "");
}

/* The leases go as soon as no get reads under them any more (they also expire). */
static void fetch_release(fetch_t *f)
{
    if (f->released || !mfd_link_ready(f->l))
        return;
    f->released = 1;
    size_t n = 0;
    uint64_t *ids = malloc((f->n ? f->n : 1) * sizeof(*ids));
    if (!ids)
        return;
    for (size_t i = 0; i < f->n; i++)
        if (f->rows[i].lease)
            ids[n++] = f->rows[i].lease;
    if (n) {
        Mapflow__V1__Release rel = MAPFLOW__V1__RELEASE__INIT;
        rel.n_lease_ids = n;
        rel.lease_ids = ids;
        mf_envelope_t e = MAPFLOW__V1__ENVELOPE__INIT;
        e.body_case = MAPFLOW__V1__ENVELOPE__BODY_RELEASE;
        e.release = &rel;
        mfd_link_call(f->l, &e, NULL, 0, on_release_reply, NULL);
    }
    free(ids);
}

static void fetch_check_done(fetch_t *f)
{
    if (f->unfinished || f->batches_out || f->inflight)
        return;
    fetch_release(f);
    mfd_hist_observe(&f->ps->hist, mf_now_s() - f->t0);
    if (f->timer)
        event_free(f->timer);
    f->sink->all_done(f);
    mfd_link_unref(f->l);
    free(f->rows);
    free(f);
}

static void on_chunk(void *arg, mf_status_t st)
{
    chunk_t *ch = arg;
    fetch_t *f = ch->f;
    frow_t *r = &f->rows[ch->row];
    r->inflight--;
    f->inflight--;
    if (st != MF_OK && r->st == MF_OK)
        r->st = MF_UNAVAILABLE;
    if (r->inflight == 0 && (r->st != MF_OK || r->issued == r->len))
        row_finish(f, ch->row);
    free(ch);
    fetch_pump(f);
    fetch_check_done(f);
}

/* Keeps up to MFD_PEER_WINDOW chunks in flight, row after row. */
static void fetch_pump(fetch_t *f)
{
    while (f->cursor < f->n && f->inflight < MFD_PEER_WINDOW && !f->batches_out) {
        size_t i = f->cursor;
        frow_t *r = &f->rows[i];
        if (r->st != MF_OK || r->issued == r->len) {
            if (r->inflight == 0)
                row_finish(f, i);
            f->cursor++;
            continue;
        }
        size_t len = r->len - r->issued < MFD_PEER_CHUNK ? (size_t)(r->len - r->issued)
                                                         : MFD_PEER_CHUNK;
        chunk_t *ch = malloc(sizeof(*ch));
        mf_status_t st = ch ? MF_OK : MF_RESOURCE_EXHAUSTED;
        if (ch) {
            *ch = (chunk_t){f, i, len};
            st = f->l->ep ? mfd_ucx_get(f->l->ep, r->off + r->issued, r->dst + r->issued, len,
                                        on_chunk, ch)
                          : MF_UNAVAILABLE;
        }
        if (st != MF_OK) {
            free(ch);
            r->st = st == MF_OUT_OF_RANGE ? MF_DATA_LOSS : MF_UNAVAILABLE;
            continue;
        }
        r->issued += len;
        r->inflight++;
        f->inflight++;
    }
}

/* Past the leases' lifetime the peer may reuse the memory: give up on the link. */
static void on_fetch_timeout(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    fetch_t *f = arg;
    mfd_link_kill(f->l, MF_UNAVAILABLE, "transfer did not finish within the lease (%llu ms)",
              (unsigned long long)f->ttl_ms);
}

static void on_lease_reply(void *arg, mf_status_t st, const char *why, const mf_envelope_t *env,
                           const mf_frame_t *fr)
{
    (void)fr;
    chunk_t *batch = arg; /* row = first row of the batch, len = rows in it */
    fetch_t *f = batch->f;
    size_t first = batch->row, n = batch->len;
    free(batch);
    f->batches_out--;
    const Mapflow__V1__GetReply *rep =
        st == MF_OK && env->body_case == MAPFLOW__V1__ENVELOPE__BODY_GET_REPLY ? env->get_reply
                                                                              : NULL;
    if (st == MF_OK && (!rep || rep->n_rows != n)) {
        st = MF_INTERNAL;
        why = "malformed GetReply";
    }
    if (st != MF_OK)
        mfd_debug("peer %s: Get: %s: %s", f->l->addr, mf_status_name(st), why ? why : "");
    int alive = mfd_link_ready(f->l);
    for (size_t k = 0; k < n; k++) {
        frow_t *r = &f->rows[first + k];
        if (st != MF_OK) {
            r->st = st;
            continue;
        }
        const Mapflow__V1__RowRef *ref = rep->rows[k];
        r->lease = ref->lease_id;
        r->st = (mf_status_t)ref->status;
        if (r->st != MF_OK)
            continue;
        if (ref->length < MF_ROW_HEADER || ref->length > MF_ROW_MAX_BYTES || !alive) {
            r->st = alive ? MF_DATA_LOSS : MF_UNAVAILABLE;
            continue;
        }
        r->off = ref->arena_offset;
        r->len = ref->length;
        r->st = f->sink->place(f, first + k, r->len, &r->dst);
    }
    if (rep && rep->lease_ttl_ms && (!f->ttl_ms || rep->lease_ttl_ms < f->ttl_ms))
        f->ttl_ms = rep->lease_ttl_ms;
    if (f->batches_out)
        return;
    uint64_t total = 0, leased = 0;
    for (size_t i = 0; i < f->n; i++)
        if (f->rows[i].st == MF_OK) {
            leased++;
            total += f->rows[i].len;
        }
    mfd_debug("peer %s: pulling %llu of %zu rows (%llu bytes) under leases", f->l->addr,
              (unsigned long long)leased, f->n, (unsigned long long)total);
    if (f->ttl_ms && mfd_link_ready(f->l)) {
        /* Leave a margin: a get finishing just as the lease lapses would race reuse. */
        uint64_t ms = f->ttl_ms - f->ttl_ms / 10;
        struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)(ms % 1000) * 1000};
        f->timer = evtimer_new(f->ps->base, on_fetch_timeout, f);
        if (f->timer)
            evtimer_add(f->timer, &tv);
    }
    fetch_pump(f);
    fetch_check_done(f);
}

static void fetch_on_ready(void *arg, mf_status_t st, const char *why)
{
    fetch_t *f = arg;
    if (st == MF_OK) {
        /* Leases on exactly the missing keys, in batches the peer accepts. */
        size_t per = f->l->max_batch, first = 0;
        for (; first < f->n && st == MF_OK; first += per) {
            size_t n = f->n - first < per ? f->n - first : per;
            Mapflow__V1__Key *keys = calloc(n, sizeof(*keys));
            Mapflow__V1__Key **kp = calloc(n, sizeof(*kp));
            chunk_t *batch = malloc(sizeof(*batch));
            if (!keys || !kp || !batch) {
                st = MF_RESOURCE_EXHAUSTED;
            } else {
                for (size_t k = 0; k < n; k++) {
                    mapflow__v1__key__init(&keys[k]);
                    keys[k].model = f->model;
                    keys[k].layer = f->rows[first + k].layer;
                    keys[k].hash.data = f->rows[first + k].hash;
                    keys[k].hash.len = 16;
                    kp[k] = &keys[k];
                }
                Mapflow__V1__Get g = MAPFLOW__V1__GET__INIT;
                g.n_keys = n;
                g.keys = kp;
                g.mode = MAPFLOW__V1__GET_MODE__GET_LEASE;
                mf_envelope_t e = MAPFLOW__V1__ENVELOPE__INIT;
                e.body_case = MAPFLOW__V1__ENVELOPE__BODY_GET;
                e.get = &g;
                *batch = (chunk_t){f, first, n};
                st = mfd_link_call(f->l, &e, NULL, 0, on_lease_reply, batch);
                if (st == MF_OK) {
                    f->batches_out++;
                    batch = NULL;
                }
            }
            free(batch);
            free(keys);
            free(kp);
            if (st != MF_OK)
                break;
        }
        if (st == MF_OK)
            return;
        why = "cannot send Get to the peer";
        /* Rows of batches already sent are settled by their replies. */
        for (size_t i = first; i < f->n; i++)
            f->rows[i].st = st;
        if (f->batches_out)
            return;
    }
    for (size_t i = 0; i < f->n; i++)
        f->rows[i].st = st;
    mfd_debug("peer %s: fetch failed: %s", f->l->addr, why ? why : mf_status_name(st));
    fetch_pump(f);
    fetch_check_done(f);
}

/* Starts a fetch of f->rows (layer, hash, st = OK) from addr under ns. */
static mf_status_t fetch_start(mfd_peers_t *ps, fetch_t *f, const char *addr, const char *ns,
                               char *err, size_t errlen)
{
    mf_status_t st;
    link_t *l = link_open(ps, addr, ns, err, errlen, &st);
    if (!l)
        return st;
    l->refs++;
    f->ps = ps;
    f->l = l;
    f->unfinished = f->n;
    f->t0 = mf_now_s();
    mfd_link_when_ready(l, fetch_on_ready, f);
    return MF_OK;
}

/* ==== read-through (server) ============================================================ */

typedef struct rt {
    mfd_conn_t *c;
    uint64_t rid;
    double t0;
    uint8_t *req;            /* the client's Get, packed, to run again locally */
    size_t req_len;
    uint8_t *payload;        /* the client's tokens */
    size_t plen;
    uint32_t B;              /* prefix Get: tokens verify rows; 0: keys */
    mf_hash128_t *h;         /* prefix Get: h[0] root, h[b + 1] block b */
    uint32_t *index;         /* fetch row → row of the client's Get */
    uint32_t *block;         /* fetch row → block (prefix Get) */
    mfd_ablock_t **blk;
    size_t n_rows;           /* rows of the client's Get */
    mfd_peer_get_done done;  /* the Get's operation resumes */
    void *done_arg;
} rt_t;

static mf_status_t rt_place(fetch_t *f, size_t i, uint64_t len, uint8_t **dst)
{
    rt_t *rt = f->ctx;
    mfd_store_t *st = &rt->c->srv->store;
    if (len > mfd_store_host_capacity(st) || mfd_store_reserve(st, len, &rt->blk[i]) != MF_OK)
        return MF_RESOURCE_EXHAUSTED;
    *dst = mfd_store_block_ptr(st, rt->blk[i]);
    return MF_OK;
}

static void noop_done(void *arg, mf_status_t st, int durable)
{
    (void)arg;
    (void)st;
    (void)durable;
}

/* Verified, then committed (the store validates again and takes the block), or freed. */
static mf_status_t rt_row_done(fetch_t *f, size_t i, mf_status_t st)
{
    rt_t *rt = f->ctx;
    mfd_server_t *s = rt->c->srv;
    mfd_ablock_t *blk = rt->blk[i];
    rt->blk[i] = NULL;
    if (!blk)
        return st;
    frow_t *r = &f->rows[i];
    const uint8_t *bytes = f->rows[i].dst;
    const char *why = "row failed verification";
    if (st == MF_OK) {
        if (rt->B) {
            uint32_t b = rt->block[i];
            const uint32_t *tok = (const uint32_t *)rt->payload + (size_t)b * rt->B;
            st = mfd_row_verify(bytes, r->len, 1, tok, rt->B, rt->h[b], rt->h[b + 1], &why);
        } else {
            st = mfd_row_verify(bytes, r->len, 1, NULL, 0, (mf_hash128_t){0, 0},
                                (mf_hash128_t){0, 0}, &why);
        }
        if (st != MF_OK)
            st = MF_DATA_LOSS;
    }
    if (st != MF_OK) {
        if (st == MF_DATA_LOSS) {
            mfd_count(&s->metrics, MFD_C_DATA_LOSS, 1);
            mfd_warn("peer %s: layer %u: %s", f->l->addr, r->layer, why);
        }
        mfd_store_unreserve(&s->store, blk);
        return st;
    }
    mfd_key_t key;
    mfd_key_make(&key, rt->c->ns, rt->c->ns_len, f->model, strlen(f->model), r->layer, r->hash);
    int pending, durable, replaced;
    st = mfd_store_commit(&s->store, &key, blk, r->len, 0, noop_done, NULL, &pending, &durable,
                          &replaced, &why);
    if (st != MF_OK) {
        mfd_warn("peer %s: layer %u: commit: %s", f->l->addr, r->layer, why);
        return st == MF_RESOURCE_EXHAUSTED ? st : MF_DATA_LOSS;
    }
    mfd_count(&s->metrics, MFD_C_PUTS, 1);
    mfd_count(&s->metrics, MFD_C_PUT_BYTES, r->len);
    return MF_OK;
}

static void rt_free(rt_t *rt)
{
    free(rt->req);
    free(rt->payload);
    free(rt->h);
    free(rt->index);
    free(rt->block);
    free(rt->blk);
    free(rt);
}

/* Hands the client's Get back to its operation, with the peer's failures filled in. */
static void rt_finish(rt_t *rt, const frow_t *rows, size_t n, mf_status_t all)
{
    mfd_conn_t *c = rt->c;
    mf_status_t *forced = calloc(rt->n_rows ? rt->n_rows : 1, sizeof(*forced));
    Mapflow__V1__Get *g = mapflow__v1__get__unpack(NULL, rt->req_len, rt->req);
    if (!forced || !g) {
        mfd_conn_error(c, rt->rid, MF_RESOURCE_EXHAUSTED, "Get: out of memory");
        rt->done(rt->done_arg, NULL, NULL);
    } else {
        for (size_t i = 0; i < n; i++)
            forced[rt->index[i]] = rows ? rows[i].st : all;
        rt->done(rt->done_arg, g, forced);
    }
    if (g)
        mapflow__v1__get__free_unpacked(g, NULL);
    free(forced);
    mfd_conn_unhold(c);
    rt_free(rt);
}

static void rt_all_done(fetch_t *f)
{
    rt_finish(f->ctx, f->rows, f->n, MF_OK);
}

static const fsink_t rt_sink = {rt_place, rt_row_done, rt_all_done};

void mfd_peers_get(mfd_conn_t *c, uint64_t rid, const Mapflow__V1__Get *m,
                   const uint8_t *payload, size_t plen, double t0, const uint32_t *missing,
                   size_t n_missing, mfd_peer_get_done done, void *done_arg)
{
    mfd_server_t *s = c->srv;
    mfd_peers_t *ps = s->peers;
    char err[256];
    rt_t *rt = calloc(1, sizeof(*rt));
    fetch_t *f = calloc(1, sizeof(*f));
    int prefix = m->n_keys == 0;
    size_t n_rows = prefix ? m->n_layers * (size_t)m->n_blocks : m->n_keys;
    if (!rt || !f)
        goto oom;
    rt->c = c;
    rt->rid = rid;
    rt->t0 = t0;
    rt->done = done;
    rt->done_arg = done_arg;
    rt->req_len = mapflow__v1__get__get_packed_size(m);
    rt->req = malloc(rt->req_len ? rt->req_len : 1);
    rt->payload = malloc(plen ? plen : 4);
    rt->index = calloc(n_missing, sizeof(uint32_t));
    rt->block = calloc(n_missing, sizeof(uint32_t));
    rt->blk = calloc(n_missing, sizeof(*rt->blk));
    f->rows = calloc(n_missing, sizeof(*f->rows));
    if (!rt->req || !rt->payload || !rt->index || !rt->block || !rt->blk || !f->rows)
        goto oom;
    mapflow__v1__get__pack(m, rt->req);
    memcpy(rt->payload, payload, plen);
    rt->plen = plen;
    if (prefix) {
        /* The server validated the request: tokens hold first_block + n_blocks blocks
         * (n_blocks 0 = the rest), one row per (layer, block), layer-major. */
        uint32_t B = m->block_size;
        size_t total = plen / 4 / B;
        size_t nb = m->n_blocks ? m->n_blocks : total - m->first_block;
        size_t upto = m->first_block + nb;
        n_rows = m->n_layers * nb;
        rt->B = B;
        rt->h = malloc((upto + 1) * sizeof(*rt->h));
        if (!rt->h)
            goto oom;
        rt->h[0] = mf_hash_root(B, c->ns, c->ns_len, m->model, strlen(m->model));
        for (size_t b = 0; b < upto; b++)
            rt->h[b + 1] = mf_hash_next(rt->h[b], (const uint32_t *)rt->payload + b * B, B);
        for (size_t k = 0; k < n_missing; k++) {
            size_t i = missing[k];
            uint32_t block = (uint32_t)(m->first_block + i % nb);
            f->rows[k].layer = m->layers[i / nb];
            mf_hash_to_le(rt->h[block + 1], f->rows[k].hash);
            rt->block[k] = block;
        }
        for (size_t k = 0; k < n_missing; k++)
            rt->index[k] = missing[k];
        f->n = n_missing;
        snprintf(f->model, sizeof(f->model), "%s", m->model);
    } else {
        /* A fetch names one model: keys of other models in the same (admin) Get stay
         * NOT_FOUND. */
        snprintf(f->model, sizeof(f->model), "%s", m->keys[missing[0]]->model);
        for (size_t k = 0; k < n_missing; k++) {
            const Mapflow__V1__Key *key = m->keys[missing[k]];
            if (strcmp(key->model, f->model) != 0)
                continue;
            f->rows[f->n].layer = key->layer;
            memcpy(f->rows[f->n].hash, key->hash.data, 16);
            rt->index[f->n++] = missing[k];
        }
    }
    rt->n_rows = n_rows;
    f->sink = &rt_sink;
    f->ctx = rt;
    mfd_conn_hold(c);
    mf_status_t st = fetch_start(ps, f, m->peer, c->ns, err, sizeof(err));
    if (st != MF_OK) {
        mfd_warn("peer %s: %s", m->peer, err);
        mfd_peer_stat(ps, m->peer)->errors++;
        size_t nf = f->n;
        free(f->rows);
        free(f);
        if (st == MF_INVALID_ARGUMENT) {
            mfd_conn_error(c, rid, st, "Get: peer '%s': %s", m->peer, err);
            done(done_arg, NULL, NULL);
            mfd_conn_unhold(c);
            rt_free(rt);
            return;
        }
        rt_finish(rt, NULL, nf, st);
    }
    return;
oom:
    if (f)
        free(f->rows);
    free(f);
    if (rt)
        rt_free(rt);
    mfd_conn_error(c, rid, MF_RESOURCE_EXHAUSTED, "Get: out of memory");
    done(done_arg, NULL, NULL);
}

/* ==== Lookup through a peer ============================================================ */

typedef struct lk {
    mfd_peers_t *ps;
    link_t *l;
    mfd_conn_t *c;
    uint64_t rid;
    double t0;
    uint8_t *req;
    size_t req_len;
    uint8_t *payload;
    size_t plen;
    mfd_peer_lookup_done done;
} lk_t;

static void lk_finish(lk_t *k, const uint32_t *blocks, size_t n)
{
    Mapflow__V1__Lookup *m = mapflow__v1__lookup__unpack(NULL, k->req_len, k->req);
    if (!m)
        mfd_conn_error(k->c, k->rid, MF_RESOURCE_EXHAUSTED, "Lookup: out of memory");
    else
        k->done(k->c, k->rid, m, k->payload, k->plen, k->t0, blocks, n);
    if (m)
        mapflow__v1__lookup__free_unpacked(m, NULL);
    mfd_conn_unhold(k->c);
    if (k->l)
        mfd_link_unref(k->l);
    free(k->req);
    free(k->payload);
    free(k);
}

static void on_lookup_reply(void *arg, mf_status_t st, const char *why, const mf_envelope_t *env,
                            const mf_frame_t *fr)
{
    (void)fr;
    lk_t *k = arg;
    if (st == MF_OK && env->body_case == MAPFLOW__V1__ENVELOPE__BODY_LOOKUP_REPLY) {
        lk_finish(k, env->lookup_reply->blocks, env->lookup_reply->n_blocks);
        return;
    }
    mfd_warn("peer %s: Lookup: %s: %s (answering with local blocks only)", k->l->addr,
             mf_status_name(st), why ? why : "unexpected reply");
    k->l->stat->errors++;
    lk_finish(k, NULL, 0);
}

static void lk_on_ready(void *arg, mf_status_t st, const char *why)
{
    lk_t *k = arg;
    Mapflow__V1__Lookup *m = NULL;
    if (st == MF_OK) {
        m = mapflow__v1__lookup__unpack(NULL, k->req_len, k->req);
        if (!m) {
            st = MF_RESOURCE_EXHAUSTED;
        } else {
            char *peer = m->peer;
            m->peer = (char *)""; /* the peer answers from what it holds itself */
            mf_envelope_t e = MAPFLOW__V1__ENVELOPE__INIT;
            e.body_case = MAPFLOW__V1__ENVELOPE__BODY_LOOKUP;
            e.lookup = m;
            st = mfd_link_call(k->l, &e, k->payload, k->plen, on_lookup_reply, k);
            m->peer = peer;
            mapflow__v1__lookup__free_unpacked(m, NULL);
            if (st == MF_OK)
                return;
        }
        why = "cannot send Lookup";
    }
    on_lookup_reply(k, st, why, NULL, NULL);
}

void mfd_peers_lookup(mfd_conn_t *c, uint64_t rid, const Mapflow__V1__Lookup *m,
                      const uint8_t *payload, size_t plen, double t0,
                      mfd_peer_lookup_done done)
{
    mfd_peers_t *ps = c->srv->peers;
    char err[256];
    lk_t *k = calloc(1, sizeof(*k));
    if (!k || !(k->req = malloc(mapflow__v1__lookup__get_packed_size(m) + 1)) ||
        !(k->payload = malloc(plen ? plen : 1))) {
        if (k)
            free(k->req);
        free(k);
        mfd_conn_error(c, rid, MF_RESOURCE_EXHAUSTED, "Lookup: out of memory");
        return;
    }
    k->ps = ps;
    k->done = done;
    k->c = c;
    k->rid = rid;
    k->t0 = t0;
    k->req_len = mapflow__v1__lookup__pack(m, k->req);
    memcpy(k->payload, payload, plen);
    k->plen = plen;
    mfd_conn_hold(c);
    mf_status_t st;
    link_t *l = link_open(ps, m->peer, c->ns, err, sizeof(err), &st);
    if (!l) {
        mfd_warn("peer %s: %s", m->peer, err);
        mfd_peer_stat(ps, m->peer)->errors++;
        if (st == MF_INVALID_ARGUMENT) {
            mfd_conn_error(c, rid, st, "Lookup: peer '%s': %s", m->peer, err);
            mfd_conn_unhold(c);
            free(k->req);
            free(k->payload);
            free(k);
            return;
        }
        lk_finish(k, NULL, 0);
        return;
    }
    l->refs++;
    k->l = l;
    mfd_link_when_ready(l, lk_on_ready, k);
}

/* ==== RemoteArena ====================================================================== */

void mfd_peers_remote_arena(mfd_conn_t *c, uint64_t rid)
{
    mfd_peers_t *ps = c->srv->peers;
    Mapflow__V1__RemoteArenaReply r = MAPFLOW__V1__REMOTE_ARENA_REPLY__INIT;
    const void *rkey;
    size_t rkey_len;
    if (c->tp != &mfd_transport_ucx || !c->has_arena || !ps ||
        mfd_ucx_arena_key(ps->ucx, &r.address, &r.bytes, &rkey, &rkey_len) != MF_OK) {
        mfd_conn_error(c, rid, MF_FAILED_PRECONDITION,
                       "RemoteArena: only on a UCX connection whose Hello asked for the arena");
        return;
    }
    r.rkey.data = (uint8_t *)rkey;
    r.rkey.len = rkey_len;
    mf_envelope_t env = MAPFLOW__V1__ENVELOPE__INIT;
    env.request_id = rid;
    env.body_case = MAPFLOW__V1__ENVELOPE__BODY_REMOTE_ARENA_REPLY;
    env.remote_arena_reply = &r;
    mfd_conn_reply(c, &env, NULL, 0);
}

/* ==== lifecycle ======================================================================== */

static mfd_peers_t *peers_new(struct event_base *base, uint32_t max_frame)
{
    mfd_peers_t *ps = calloc(1, sizeof(*ps));
    if (!ps)
        return NULL;
    ps->base = base;
    ps->max_frame = max_frame;
    ps->sweep = event_new(base, -1, EV_PERSIST, mfd_links_sweep, ps);
    struct timeval tv = {0, LINK_SWEEP_MS * 1000};
    if (!ps->sweep || event_add(ps->sweep, &tv)) {
        if (ps->sweep)
            event_free(ps->sweep);
        free(ps);
        return NULL;
    }
    return ps;
}

mf_status_t mfd_peers_create(mfd_server_t *s, mfd_peers_t **out, char *err, size_t errlen)
{
    mfd_peers_t *ps = peers_new(s->base, (uint32_t)s->cfg.max_frame);
    if (!ps) {
        snprintf(err, errlen, "peers: out of memory");
        return MF_RESOURCE_EXHAUSTED;
    }
    ps->srv = s;
    if (s->cfg.ucx && s->cfg.ucx[0]) {
        struct sockaddr_storage ss;
        socklen_t sl;
        mf_status_t st = MF_OK;
        if (mf_addr_resolve(s->cfg.ucx, 1, &ss, &sl) != MF_OK) {
            snprintf(err, errlen, "ucx: cannot parse '%s' as host:port", s->cfg.ucx);
            st = MF_INVALID_ARGUMENT;
        } else if (!mf_addr_is_loopback(&ss) && !s->cfg.token[0]) {
            snprintf(err, errlen,
                     "ucx: refusing to listen on non-loopback %s without a token (set `token`)",
                     s->cfg.ucx);
            st = MF_FAILED_PRECONDITION;
        } else {
            st = ensure_ucx(ps, s->cfg.ucx, err, errlen);
        }
        if (st != MF_OK) {
            mfd_peers_destroy(ps);
            return st;
        }
        mfd_info("listening on ucx:%s%s", mfd_ucx_bound(ps->ucx),
                 s->cfg.token[0] ? " (token required)" : "");
    }
    *out = ps;
    return MF_OK;
}

mf_status_t mfd_peers_create_client(struct event_base *base, const char *token,
                                    uint32_t max_frame, mfd_peers_t **out, char *err,
                                    size_t errlen)
{
    mfd_peers_t *ps = peers_new(base, max_frame ? max_frame : MF_FRAME_DEFAULT_MAX);
    if (!ps) {
        snprintf(err, errlen, "peers: out of memory");
        return MF_RESOURCE_EXHAUSTED;
    }
    snprintf(ps->own_token, sizeof(ps->own_token), "%s", token ? token : "");
    ps->token = ps->own_token;
    mf_status_t st = ensure_ucx(ps, NULL, err, errlen);
    if (st != MF_OK) {
        mfd_peers_destroy(ps);
        return st;
    }
    *out = ps;
    return MF_OK;
}

void mfd_peers_stop_listening(mfd_peers_t *ps)
{
    if (ps)
        mfd_ucx_stop_listening(ps->ucx);
}

void mfd_peers_destroy(mfd_peers_t *ps)
{
    if (!ps)
        return;
    ps->destroying = 1;
    while (ps->links)
        mfd_link_kill(ps->links, MF_UNAVAILABLE, "daemon shutting down");
    /* Closing the endpoints completes the gets in flight (rows UNAVAILABLE). */
    mfd_ucx_destroy(ps->ucx);
    if (ps->sweep)
        event_free(ps->sweep);
    free(ps);
}

/* ==== standalone client ================================================================ */

typedef struct cl {
    mfd_peer_row_t *rows;
    void (*done)(void *arg);
    void *arg;
} cl_t;

static mf_status_t cl_place(fetch_t *f, size_t i, uint64_t len, uint8_t **dst)
{
    cl_t *cl = f->ctx;
    if (len > cl->rows[i].cap)
        return MF_RESOURCE_EXHAUSTED;
    cl->rows[i].len = len;
    *dst = cl->rows[i].dst;
    return MF_OK;
}

static mf_status_t cl_row_done(fetch_t *f, size_t i, mf_status_t st)
{
    cl_t *cl = f->ctx;
    cl->rows[i].status = st;
    return st;
}

static void cl_all_done(fetch_t *f)
{
    cl_t *cl = f->ctx;
    for (size_t i = 0; i < f->n; i++)
        cl->rows[i].status = f->rows[i].st;
    cl->done(cl->arg);
    free(cl);
}

static const fsink_t cl_sink = {cl_place, cl_row_done, cl_all_done};

mf_status_t mfd_peers_fetch(mfd_peers_t *ps, const char *addr, const char *ns,
                            const char *model, mfd_peer_row_t *rows, size_t n,
                            void (*done)(void *arg), void *arg)
{
    char err[256];
    if (!n || !model || strlen(model) > MFD_MODEL_MAX)
        return MF_INVALID_ARGUMENT;
    fetch_t *f = calloc(1, sizeof(*f));
    cl_t *cl = calloc(1, sizeof(*cl));
    if (!f || !cl || !(f->rows = calloc(n, sizeof(*f->rows)))) {
        free(f);
        free(cl);
        return MF_RESOURCE_EXHAUSTED;
    }
    for (size_t i = 0; i < n; i++) {
        f->rows[i].layer = rows[i].layer;
        memcpy(f->rows[i].hash, rows[i].hash, 16);
        rows[i].status = MF_UNAVAILABLE;
        rows[i].len = 0;
    }
    snprintf(f->model, sizeof(f->model), "%s", model);
    f->n = n;
    f->sink = &cl_sink;
    f->ctx = cl;
    *cl = (cl_t){rows, done, arg};
    mf_status_t st = fetch_start(ps, f, addr, ns, err, sizeof(err));
    if (st != MF_OK) {
        mfd_warn("peer %s: %s", addr, err);
        free(f->rows);
        free(f);
        free(cl);
    }
    return st;
}

/* ==== metrics ========================================================================== */

void mfd_peers_metrics(mfd_prom_t *b, void *arg)
{
    const mfd_peers_t *ps = arg;
    static const struct {
        const char *name, *help;
        size_t off;
    } fams[] = {
        {"peer_fetched_rows_total", "rows pulled from peer daemons over UCX, by peer",
         offsetof(peer_stat_t, rows)},
        {"peer_fetched_bytes_total", "bytes pulled from peer daemons over UCX, by peer",
         offsetof(peer_stat_t, bytes)},
        {"peer_errors_total",
         "failed peer links and rows a peer could not deliver (not NOT_FOUND), by peer",
         offsetof(peer_stat_t, errors)},
        {"peer_requests_total", "control requests sent to peer daemons, by peer",
         offsetof(peer_stat_t, requests)},
    };
    size_t rows = ps ? ps->n_stats + (ps->stats[MAX_PEER_STATS].addr[0] != 0) : 0;
    for (size_t f = 0; f < sizeof(fams) / sizeof(fams[0]); f++) {
        mfd_prom_family(b, fams[f].name, "counter", fams[f].help);
        for (size_t i = 0; i < rows; i++) {
            const peer_stat_t *s = i < ps->n_stats ? &ps->stats[i] : &ps->stats[MAX_PEER_STATS];
            mfd_prom_labelled(b, fams[f].name, "peer", s->addr,
                              *(const uint64_t *)((const char *)s + fams[f].off));
        }
    }
    mfd_prom_family(b, "peer_fetch_duration_seconds", "histogram",
                    "time from a peer fetch's start (link, leases) to its last row verified");
    mfd_hist_t h = ps ? ps->hist : (mfd_hist_t){0};
    mfd_prom_hist(b, "peer_fetch_duration_seconds", "", &h);
    mfd_prom_family(b, "ucx_endpoints", "gauge", "UCX endpoints open now (peers in and out)");
    mfd_prom_u64(b, "ucx_endpoints", "", mfd_ucx_endpoints(ps ? ps->ucx : NULL));
}
