/*
 * calls — libmapflow's data calls: put (two-phase), lookup, get (copy / lease, by prefix
 * or by key), release, delete. Declared and documented in mapflow.h; every call takes
 * the channel lock for its exchange (see channel.h).
 */
#include <stdlib.h>
#include <string.h>

#include "channel.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "libmapflow sends token arrays as they sit in memory: little-endian hosts only"
#endif

/* Fills a protobuf Key from an mf_key_t; hb holds the 16 hash bytes it points to. */
static mf_status_t key_to_pb(mf_channel_t *ch, const mf_key_t *key, Mapflow__V1__Key *pb,
                             uint8_t hb[16])
{
    size_t ml = key && key->model ? strlen(key->model) : 0;
    if (ml == 0 || ml > MF_ROW_MAX_MODEL)
        return mf__chan_error(ch, MF_INVALID_ARGUMENT, "model id must be 1..%d bytes",
                              MF_ROW_MAX_MODEL);
    mapflow__v1__key__init(pb);
    mf_hash_to_le(key->hash, hb);
    pb->model = (char *)key->model;
    pb->layer = key->layer;
    pb->hash.data = hb;
    pb->hash.len = 16;
    return MF_OK;
}

static mf_status_t check_model(mf_channel_t *ch, const char *model)
{
    size_t ml = model ? strlen(model) : 0;
    if (ml == 0 || ml > MF_ROW_MAX_MODEL)
        return mf__chan_error(ch, MF_INVALID_ARGUMENT, "model id must be 1..%d bytes",
                              MF_ROW_MAX_MODEL);
    return MF_OK;
}

/* ==== put ============================================================================ */

/* Validates the row as the daemon will and extracts its key. */
static mf_status_t put_key_of(mf_channel_t *ch, const void *row, size_t len,
                              char model[MF_ROW_MAX_MODEL + 1], mf_key_t *key)
{
    const void *buf = row;
    void *tmp = NULL;
    if ((uintptr_t)row % MF_ROW_ALIGN) { /* the decoder needs 16-byte alignment */
        tmp = aligned_alloc(MF_ROW_ALIGN, (len + MF_ROW_ALIGN - 1) & ~(size_t)15);
        if (!tmp)
            return mf__chan_error(ch, MF_RESOURCE_EXHAUSTED, "out of memory");
        memcpy(tmp, row, len);
        buf = tmp;
    }
    mf_row_view_t v;
    const char *why = "";
    mf_status_t st = mf_row_decode(buf, len, 0, &v, &why);
    if (st == MF_OK) {
        memcpy(model, v.model, v.model_len);
        model[v.model_len] = '\0';
        key->model = model;
        key->layer = v.layer;
        key->hash = v.hash;
    } else {
        mf__chan_error(ch, st, "row rejected before sending: %s", why);
    }
    free(tmp);
    return st;
}

static mf_status_t do_put(mf_channel_t *ch, const mf_key_t *key, const void *row, size_t len,
                          unsigned flags, mf_put_result_t *res, int64_t timeout_ms)
{
    uint8_t hb[16];
    Mapflow__V1__Key kpb;
    Mapflow__V1__PutBegin pb = MAPFLOW__V1__PUT_BEGIN__INIT;
    mf_status_t st = key_to_pb(ch, key, &kpb, hb);
    if (st != MF_OK)
        return st;
    pb.key = &kpb;
    pb.size = len;
    pb.durable = (flags & MF_PUT_DURABLE) != 0;
    ENV(req, PUT_BEGIN, put_begin) = &pb;
    mf__reply_t rep;
    st = mf__chan_do_call(ch, &req, NULL, 0, MAPFLOW__V1__ENVELOPE__BODY_PUT_BEGIN_REPLY,
                          timeout_ms, &rep);
    if (st != MF_OK)
        return st;
    uint64_t rid = rep.env->put_begin_reply->reservation_id;
    int in_arena = rep.env->put_begin_reply->in_arena;
    uint64_t off = rep.env->put_begin_reply->arena_offset;
    mf__reply_done(&rep);

    Mapflow__V1__PutCommit pc = MAPFLOW__V1__PUT_COMMIT__INIT;
    pc.reservation_id = rid;
    ENV(creq, PUT_COMMIT, put_commit) = &pc;
    if (in_arena) {
        if (!ch->arena || off % MF_ROW_ALIGN || off > ch->arena_bytes ||
            len > ch->arena_bytes - off) {
            st = mf__chan_error(ch, MF_INTERNAL, "daemon reserved arena bytes [%llu, +%zu) "
                                "outside the mapped arena", (unsigned long long)off, len);
            goto abort_reservation;
        }
        memcpy(ch->arena + off, row, len);
        st = mf__chan_do_call(ch, &creq, NULL, 0, MAPFLOW__V1__ENVELOPE__BODY_PUT_COMMIT_REPLY,
                              timeout_ms, &rep);
    } else {
        st = mf__chan_do_call(ch, &creq, row, len, MAPFLOW__V1__ENVELOPE__BODY_PUT_COMMIT_REPLY,
                              timeout_ms, &rep);
    }
    if (st != MF_OK)
        goto abort_reservation;
    if (res) {
        res->tier = (mf_tier_t)rep.env->put_commit_reply->tier;
        res->durable = rep.env->put_commit_reply->durable;
        res->replaced = rep.env->put_commit_reply->replaced;
    }
    mf__reply_done(&rep);
    return MF_OK;

abort_reservation:
    /* Best effort: the daemon also frees it at its TTL or when we disconnect. Its reply
     * (or NOT_FOUND when the commit already freed it) is dropped as stale. */
    {
        Mapflow__V1__PutAbort pa = MAPFLOW__V1__PUT_ABORT__INIT;
        pa.reservation_id = rid;
        ENV(areq, PUT_ABORT, put_abort) = &pa;
        char keep[MF__ERR_LEN];
        memcpy(keep, ch->err, sizeof(keep));
        mf__chan_do_send(ch, &areq, MF_TIMEOUT_DEFAULT);
        memcpy(ch->err, keep, sizeof(keep));
    }
    return st;
}

MF_EXPORT mf_status_t mf_put(mf_channel_t *ch, const void *row, size_t len, unsigned flags,
                             mf_put_result_t *res, int64_t timeout_ms)
{
    if (!ch)
        return MF_INVALID_ARGUMENT;
    mf__chan_lock(ch);
    char model[MF_ROW_MAX_MODEL + 1];
    mf_key_t key;
    mf_status_t st;
    if (!row || len == 0 || len > MF_ROW_MAX_BYTES)
        st = mf__chan_error(ch, MF_INVALID_ARGUMENT, "empty or oversized row");
    else
        st = put_key_of(ch, row, len, model, &key);
    if (st == MF_OK)
        st = do_put(ch, &key, row, len, flags, res, timeout_ms);
    mf__chan_unlock(ch);
    return st;
}

/* ==== lookup ========================================================================= */

MF_EXPORT mf_status_t mf_lookup(mf_channel_t *ch, const char *model, uint32_t block_size,
                                const uint32_t *tokens, size_t n_tokens,
                                const uint32_t *layers, size_t n_layers, uint32_t *blocks,
                                uint32_t *total_blocks, int64_t timeout_ms)
{
    if (!ch)
        return MF_INVALID_ARGUMENT;
    mf__chan_lock(ch);
    mf_status_t st = check_model(ch, model);
    if (st != MF_OK)
        goto unlock;
    if (block_size == 0 || (n_tokens && !tokens) || n_layers == 0 || !layers || !blocks) {
        st = mf__chan_error(ch, MF_INVALID_ARGUMENT, "lookup needs block_size > 0, tokens "
                            "and at least one layer");
        goto unlock;
    }
    Mapflow__V1__Lookup lk = MAPFLOW__V1__LOOKUP__INIT;
    lk.model = (char *)model;
    lk.block_size = block_size;
    lk.n_layers = n_layers;
    lk.layers = (uint32_t *)layers;
    ENV(req, LOOKUP, lookup) = &lk;
    size_t full = n_tokens - n_tokens % block_size; /* only full blocks count */
    mf__reply_t rep;
    st = mf__chan_do_call(ch, &req, tokens, full * 4, MAPFLOW__V1__ENVELOPE__BODY_LOOKUP_REPLY,
                          timeout_ms, &rep);
    if (st != MF_OK)
        goto unlock;
    Mapflow__V1__LookupReply *lr = rep.env->lookup_reply;
    if (lr->n_blocks != n_layers) {
        st = mf__chan_error(ch, MF_INTERNAL, "lookup reply has %zu layers, asked %zu",
                            lr->n_blocks, n_layers);
    } else {
        memcpy(blocks, lr->blocks, n_layers * sizeof(uint32_t));
        if (total_blocks)
            *total_blocks = lr->total_blocks;
    }
    mf__reply_done(&rep);
unlock:
    mf__chan_unlock(ch);
    return st;
}

/* ==== get ============================================================================ */

/* What each returned row must agree with (prefix mode: tokens; keys mode: the key). */
typedef struct get_expect {
    const char *model;
    uint32_t block_size;
    const uint32_t *tokens;     /* prefix mode */
    size_t n_tokens;
    const mf_key_t *keys;       /* keys mode */
} get_expect_t;

/* Decodes one returned row and checks it against the request: never hand out bytes
 * that are not what was asked for. */
static mf_status_t verify_row(const get_expect_t *x, size_t i, mf_row_ref_t *r,
                              const char **why)
{
    mf_status_t st = mf_row_decode(r->data, r->length, 0, &r->view, why);
    if (st != MF_OK)
        return MF_DATA_LOSS;
    const mf_row_view_t *v = &r->view;
    if (x->keys) {
        const mf_key_t *k = &x->keys[i];
        if (v->layer != k->layer || !mf_hash_eq(v->hash, k->hash) ||
            v->model_len != strlen(k->model) || memcmp(v->model, k->model, v->model_len)) {
            *why = "row does not carry the requested key";
            return MF_DATA_LOSS;
        }
        r->layer = v->layer;
        r->block = v->block_index;
        return MF_OK;
    }
    if (v->layer != r->layer || v->block_index != r->block || v->block_size != x->block_size ||
        v->model_len != strlen(x->model) || memcmp(v->model, x->model, v->model_len)) {
        *why = "row does not carry the requested model, layer or block";
        return MF_DATA_LOSS;
    }
    size_t t0 = (size_t)r->block * x->block_size;
    if (t0 + x->block_size > x->n_tokens ||
        memcmp(v->tokens, x->tokens + t0, x->block_size * sizeof(uint32_t))) {
        *why = "row tokens differ from the request";
        return MF_DATA_LOSS;
    }
    return MF_OK;
}

/* Turns a GetReply into an mf_get_result_t; the reply payload (copy mode) is copied into
 * 16-byte aligned memory the result owns. */
static mf_status_t get_result_build(mf_channel_t *ch, const mf__reply_t *rep,
                                    mf_get_mode_t mode, const get_expect_t *x,
                                    size_t expect_rows, mf_get_result_t **out)
{
    Mapflow__V1__GetReply *gr = rep->env->get_reply;
    if (gr->n_rows != expect_rows)
        return mf__chan_error(ch, MF_INTERNAL, "get reply has %zu rows, expected %zu",
                              gr->n_rows, expect_rows);
    mf_get_result_t *res = calloc(1, sizeof(*res));
    if (!res)
        return mf__chan_error(ch, MF_RESOURCE_EXHAUSTED, "out of memory");
    res->rows = calloc(gr->n_rows ? gr->n_rows : 1, sizeof(mf_row_ref_t));
    uint8_t *copy = NULL;
    if (mode == MF_GET_COPY && rep->payload_len)
        copy = res->priv_ = aligned_alloc(16, ((size_t)rep->payload_len + 15) & ~(size_t)15);
    if (!res->rows || (mode == MF_GET_COPY && rep->payload_len && !copy)) {
        mf_get_result_free(res);
        return mf__chan_error(ch, MF_RESOURCE_EXHAUSTED, "out of memory");
    }
    if (copy)
        memcpy(copy, rep->payload, rep->payload_len);
    res->n_rows = gr->n_rows;
    res->lease_ttl_ms = gr->lease_ttl_ms;
    for (size_t i = 0; i < gr->n_rows; i++) {
        const Mapflow__V1__RowRef *rr = gr->rows[i];
        mf_row_ref_t *r = &res->rows[i];
        r->status = mf_status_valid((int)rr->status) ? (mf_status_t)rr->status : MF_UNKNOWN;
        r->layer = rr->layer;
        r->block = rr->block;
        r->tier = (mf_tier_t)rr->tier;
        r->lease_id = rr->lease_id;
        if (r->status != MF_OK)
            continue;
        r->length = rr->length;
        const char *why = "row outside the reply";
        if (mode == MF_GET_COPY) {
            if (rr->payload_offset % 16 || rr->payload_offset > rep->payload_len ||
                rr->length > rep->payload_len - rr->payload_offset) {
                r->status = MF_DATA_LOSS;
                continue;
            }
            r->data = copy + rr->payload_offset;
        } else {
            if (!ch->arena || rr->arena_offset % 16 || rr->arena_offset > ch->arena_bytes ||
                rr->length > ch->arena_bytes - rr->arena_offset) {
                r->status = MF_DATA_LOSS;
                continue;
            }
            r->data = ch->arena + rr->arena_offset;
        }
        r->status = verify_row(x, i, r, &why);
        if (r->status != MF_OK) {
            mf__chan_error(ch, MF_DATA_LOSS, "row %zu (layer %u block %u): %s", i, r->layer,
                           r->block, why);
            r->data = NULL;
        }
    }
    *out = res;
    return MF_OK;
}

static mf_status_t check_mode(mf_channel_t *ch, mf_get_mode_t mode, mf_get_result_t **out)
{
    if (!out)
        return mf__chan_error(ch, MF_INVALID_ARGUMENT, "no result pointer");
    *out = NULL;
    if (mode != MF_GET_COPY && mode != MF_GET_LEASE)
        return mf__chan_error(ch, MF_INVALID_ARGUMENT, "unknown get mode %d", (int)mode);
    if (mode == MF_GET_LEASE && !ch->arena)
        return mf__chan_error(ch, MF_FAILED_PRECONDITION, "leased gets need the host arena "
                              "(open the channel on a unix socket with want_arena)");
    return MF_OK;
}

MF_EXPORT mf_status_t mf_get_prefix(mf_channel_t *ch, const char *model, uint32_t block_size,
                                    const uint32_t *tokens, size_t n_tokens,
                                    const uint32_t *layers, size_t n_layers,
                                    uint32_t first_block, uint32_t n_blocks,
                                    mf_get_mode_t mode, mf_get_result_t **out,
                                    int64_t timeout_ms)
{
    if (!ch)
        return MF_INVALID_ARGUMENT;
    mf__chan_lock(ch);
    mf_status_t st = check_mode(ch, mode, out);
    if (st == MF_OK)
        st = check_model(ch, model);
    if (st != MF_OK)
        goto unlock;
    size_t have_blocks = block_size ? n_tokens / block_size : 0;
    size_t end = n_blocks ? (size_t)first_block + n_blocks : have_blocks;
    if (block_size == 0 || !tokens || !layers || n_layers == 0 || end > have_blocks ||
        end <= first_block) {
        st = mf__chan_error(ch, MF_INVALID_ARGUMENT, "get needs layers and tokens covering "
                            "blocks [%u, %zu) of %u tokens (have %zu full blocks)", first_block,
                            end, block_size, have_blocks);
        goto unlock;
    }
    Mapflow__V1__Get g = MAPFLOW__V1__GET__INIT;
    g.model = (char *)model;
    g.block_size = block_size;
    g.n_layers = n_layers;
    g.layers = (uint32_t *)layers;
    g.first_block = first_block;
    g.n_blocks = (uint32_t)(end - first_block);
    g.mode = (Mapflow__V1__GetMode)mode;
    ENV(req, GET, get) = &g;
    mf__reply_t rep;
    st = mf__chan_do_call(ch, &req, tokens, end * block_size * 4,
                          MAPFLOW__V1__ENVELOPE__BODY_GET_REPLY, timeout_ms, &rep);
    if (st != MF_OK)
        goto unlock;
    get_expect_t x = {.model = model, .block_size = block_size, .tokens = tokens,
                      .n_tokens = end * block_size};
    st = get_result_build(ch, &rep, mode, &x, n_layers * (end - first_block), out);
    mf__reply_done(&rep);
unlock:
    mf__chan_unlock(ch);
    return st;
}

/* mf_get_keys with the lock held. */
static mf_status_t do_get_keys(mf_channel_t *ch, const mf_key_t *keys, size_t n_keys,
                               mf_get_mode_t mode, mf_get_result_t **out, int64_t timeout_ms)
{
    mf_status_t st = check_mode(ch, mode, out);
    if (st != MF_OK)
        return st;
    if (!keys || n_keys == 0 || n_keys > (1u << 20))
        return mf__chan_error(ch, MF_INVALID_ARGUMENT, "get needs 1..%u keys", 1u << 20);
    Mapflow__V1__Key *kpb = malloc(n_keys * sizeof(*kpb));
    Mapflow__V1__Key **kp = malloc(n_keys * sizeof(*kp));
    uint8_t(*hb)[16] = malloc(n_keys * 16);
    if (!kpb || !kp || !hb) {
        st = mf__chan_error(ch, MF_RESOURCE_EXHAUSTED, "out of memory");
        goto free_keys;
    }
    for (size_t i = 0; i < n_keys && st == MF_OK; i++) {
        st = key_to_pb(ch, &keys[i], &kpb[i], hb[i]);
        kp[i] = &kpb[i];
    }
    if (st != MF_OK)
        goto free_keys;
    Mapflow__V1__Get g = MAPFLOW__V1__GET__INIT;
    g.n_keys = n_keys;
    g.keys = kp;
    g.mode = (Mapflow__V1__GetMode)mode;
    ENV(req, GET, get) = &g;
    mf__reply_t rep;
    st = mf__chan_do_call(ch, &req, NULL, 0, MAPFLOW__V1__ENVELOPE__BODY_GET_REPLY, timeout_ms,
                          &rep);
    if (st == MF_OK) {
        get_expect_t x = {.keys = keys};
        st = get_result_build(ch, &rep, mode, &x, n_keys, out);
        mf__reply_done(&rep);
    }
free_keys:
    free(hb);
    free(kp);
    free(kpb);
    return st;
}

MF_EXPORT mf_status_t mf_get_keys(mf_channel_t *ch, const mf_key_t *keys, size_t n_keys,
                                  mf_get_mode_t mode, mf_get_result_t **out,
                                  int64_t timeout_ms)
{
    if (!ch)
        return MF_INVALID_ARGUMENT;
    mf__chan_lock(ch);
    mf_status_t st = do_get_keys(ch, keys, n_keys, mode, out, timeout_ms);
    mf__chan_unlock(ch);
    return st;
}

MF_EXPORT void mf_get_result_free(mf_get_result_t *r)
{
    if (!r)
        return;
    free(r->priv_);
    free(r->rows);
    free(r);
}

/* One key, one row: the row's own status becomes the call's. */
static mf_status_t get_one(mf_channel_t *ch, const mf_key_t *key, mf_get_mode_t mode,
                           mf_get_result_t **res, int64_t timeout_ms)
{
    mf_status_t st = do_get_keys(ch, key, 1, mode, res, timeout_ms);
    if (st != MF_OK)
        return st;
    st = (*res)->rows[0].status;
    if (st == MF_NOT_FOUND)
        mf__chan_error(ch, st, "no such key");
    else if (st != MF_OK && !ch->err[0])
        mf__chan_error(ch, st, "row: %s", mf_strerror((int)st));
    return st;
}

MF_EXPORT mf_status_t mf_get(mf_channel_t *ch, const mf_key_t *key, void *buf, size_t cap,
                             size_t *len, int64_t timeout_ms)
{
    if (!ch || !len)
        return MF_INVALID_ARGUMENT;
    mf__chan_lock(ch);
    mf_get_result_t *res = NULL;
    mf_status_t st = get_one(ch, key, MF_GET_COPY, &res, timeout_ms);
    if (st == MF_OK) {
        *len = res->rows[0].length;
        if (cap < *len || !buf)
            st = mf__chan_error(ch, MF_RESOURCE_EXHAUSTED, "row is %zu bytes, buffer %zu",
                                *len, cap);
        else
            memcpy(buf, res->rows[0].data, *len);
    }
    mf_get_result_free(res);
    mf__chan_unlock(ch);
    return st;
}

MF_EXPORT mf_status_t mf_get_lease(mf_channel_t *ch, const mf_key_t *key, mf_lease_t *out,
                                   int64_t timeout_ms)
{
    if (!ch || !out)
        return MF_INVALID_ARGUMENT;
    memset(out, 0, sizeof(*out));
    mf__chan_lock(ch);
    mf_get_result_t *res = NULL;
    mf_status_t st = get_one(ch, key, MF_GET_LEASE, &res, timeout_ms);
    if (res) {
        mf_row_ref_t *r = &res->rows[0];
        out->lease_id = r->lease_id; /* set even on DATA_LOSS, so the caller can release */
        out->ttl_ms = res->lease_ttl_ms;
        if (st == MF_OK) {
            out->data = r->data;
            out->length = r->length;
            out->view = r->view;
        }
    }
    mf_get_result_free(res);
    mf__chan_unlock(ch);
    return st;
}

/* ==== release, delete ================================================================ */

static mf_status_t do_release(mf_channel_t *ch, const uint64_t *ids, size_t n,
                              uint32_t *released, int64_t timeout_ms)
{
    Mapflow__V1__Release rl = MAPFLOW__V1__RELEASE__INIT;
    rl.n_lease_ids = n;
    rl.lease_ids = (uint64_t *)ids;
    ENV(req, RELEASE, release) = &rl;
    mf__reply_t rep;
    mf_status_t st = mf__chan_do_call(ch, &req, NULL, 0,
                                      MAPFLOW__V1__ENVELOPE__BODY_RELEASE_REPLY, timeout_ms,
                                      &rep);
    if (st != MF_OK)
        return st;
    if (released)
        *released = rep.env->release_reply->released;
    mf__reply_done(&rep);
    return MF_OK;
}

MF_EXPORT mf_status_t mf_release(mf_channel_t *ch, const uint64_t *lease_ids, size_t n,
                                 uint32_t *released, int64_t timeout_ms)
{
    if (!ch || (n && !lease_ids))
        return MF_INVALID_ARGUMENT;
    mf__chan_lock(ch);
    mf_status_t st = do_release(ch, lease_ids, n, released, timeout_ms);
    mf__chan_unlock(ch);
    return st;
}

MF_EXPORT mf_status_t mf_release_result(mf_channel_t *ch, mf_get_result_t *r,
                                        int64_t timeout_ms)
{
    if (!ch || !r)
        return MF_INVALID_ARGUMENT;
    uint64_t *ids = malloc((r->n_rows ? r->n_rows : 1) * sizeof(uint64_t));
    if (!ids)
        return MF_RESOURCE_EXHAUSTED;
    size_t n = 0;
    for (size_t i = 0; i < r->n_rows; i++)
        if (r->rows[i].lease_id)
            ids[n++] = r->rows[i].lease_id;
    mf_status_t st = MF_OK;
    if (n) {
        mf__chan_lock(ch);
        st = do_release(ch, ids, n, NULL, timeout_ms);
        mf__chan_unlock(ch);
    }
    if (st == MF_OK)
        for (size_t i = 0; i < r->n_rows; i++)
            r->rows[i].lease_id = 0;
    free(ids);
    return st;
}

static mf_status_t do_delete(mf_channel_t *ch, Mapflow__V1__Delete *d, uint64_t *deleted,
                             int64_t timeout_ms)
{
    ENV(req, DELETE, delete_) = d;
    mf__reply_t rep;
    mf_status_t st = mf__chan_do_call(ch, &req, NULL, 0,
                                      MAPFLOW__V1__ENVELOPE__BODY_DELETE_REPLY, timeout_ms,
                                      &rep);
    if (st != MF_OK)
        return st;
    if (deleted)
        *deleted = rep.env->delete_reply->deleted;
    mf__reply_done(&rep);
    return MF_OK;
}

MF_EXPORT mf_status_t mf_delete(mf_channel_t *ch, const mf_key_t *key, uint64_t *deleted,
                                int64_t timeout_ms)
{
    if (!ch)
        return MF_INVALID_ARGUMENT;
    mf__chan_lock(ch);
    uint8_t hb[16];
    Mapflow__V1__Key kpb;
    Mapflow__V1__Delete d = MAPFLOW__V1__DELETE__INIT;
    mf_status_t st = key_to_pb(ch, key, &kpb, hb);
    if (st == MF_OK) {
        d.key = &kpb;
        st = do_delete(ch, &d, deleted, timeout_ms);
    }
    mf__chan_unlock(ch);
    return st;
}

MF_EXPORT mf_status_t mf_delete_model(mf_channel_t *ch, const char *model, int64_t layer,
                                      uint64_t *deleted, int64_t timeout_ms)
{
    if (!ch)
        return MF_INVALID_ARGUMENT;
    mf__chan_lock(ch);
    Mapflow__V1__Delete d = MAPFLOW__V1__DELETE__INIT;
    mf_status_t st = check_model(ch, model);
    if (st == MF_OK) {
        d.model = (char *)model;
        d.has_layer = layer >= 0;
        d.layer = layer >= 0 ? (uint32_t)layer : 0;
        st = do_delete(ch, &d, deleted, timeout_ms);
    }
    mf__chan_unlock(ch);
    return st;
}
