/*
 * calls_get — mf_get_prefix, mf_get_keys and their single-row forms (sync and async):
 * copy or lease, rows checked against the request (mf_row_match) before the caller sees
 * them, leased views inside the mapped arenas or copied in by the arena ops and released.
 * See calls.c for the shape every call has; steps run on the channel's I/O thread.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "channel.h"
#include "calls_internal.h"

/* ==== get ============================================================================ */

enum get_single { GET_MANY = 0, GET_ONE_COPY, GET_ONE_LEASE };

/* What each returned row must agree with, and where the outcome goes. */
typedef struct get_arg {
    mf_get_mode_t mode;
    int arena_copy;             /* copy mode sent as a lease: memcpy from the arena, release */
    size_t expect_rows;
    /* prefix mode (copies) */
    char *model;
    uint32_t block_size;
    uint32_t *tokens;           /* also the request payload */
    size_t n_tokens;
    /* keys mode (copies; model strings in key_models) */
    mf_key_t *keys;
    char *key_models;
    /* outputs */
    int single;
    mf_get_result_t **out;
    void *buf;                  /* GET_ONE_COPY */
    size_t cap;
    size_t *len;
    mf_lease_t *lease;          /* GET_ONE_LEASE */
} get_arg_t;

static void get_arg_free(void *arg)
{
    get_arg_t *a = arg;
    free(a->model);
    free(a->tokens);
    free(a->keys);
    free(a->key_models);
    free(a);
}

/* Decodes one returned row and checks it against the request: never hand out bytes
 * that are not what was asked for. */
static mf_status_t verify_row(const get_arg_t *x, size_t i, mf_row_ref_t *r, unsigned flags,
                              const char **why)
{
    mf_status_t st = mf_row_decode(r->data, r->length, flags, &r->view, why);
    if (st != MF_OK)
        return MF_DATA_LOSS;
    const mf_row_view_t *v = &r->view;
    mf_row_want_t w = {.fields = MF_MATCH_MODEL | MF_MATCH_LAYER};
    if (x->keys) {
        const mf_key_t *k = &x->keys[i];
        w.fields |= MF_MATCH_HASH;
        w.model = k->model;
        w.model_len = strlen(k->model);
        w.layer = k->layer;
        w.hash = k->hash;
    } else {
        size_t t0 = (size_t)r->block * x->block_size;
        if (t0 + x->block_size > x->n_tokens) {
            *why = "row's block lies past the request's tokens";
            return MF_DATA_LOSS;
        }
        w.fields |= MF_MATCH_BLOCK | MF_MATCH_TOKENS;
        w.model = x->model;
        w.model_len = strlen(x->model);
        w.layer = r->layer;
        w.block_index = r->block;
        w.block_size = x->block_size;
        w.tokens = x->tokens + t0;
    }
    if (!mf_row_match(v, &w, why))
        return MF_DATA_LOSS;
    r->layer = v->layer;
    r->block = v->block_index;
    return MF_OK;
}

/* Gives back the leases of a GetReply (UCX: its rows are already copied here). Best
 * effort and one-way: the daemon also drops them at their TTL or with the connection. */
static void release_reply_leases(mf__op_t *op, const Mapflow__V1__GetReply *gr)
{
    uint64_t *ids = malloc((gr->n_rows ? gr->n_rows : 1) * sizeof(*ids));
    size_t n = 0;
    for (size_t i = 0; ids && i < gr->n_rows; i++)
        if (gr->rows[i]->lease_id)
            ids[n++] = gr->rows[i]->lease_id;
    if (n) {
        Mapflow__V1__Release rl = MAPFLOW__V1__RELEASE__INIT;
        rl.n_lease_ids = n;
        rl.lease_ids = ids;
        ENV(req, RELEASE, release) = &rl;
        mf__send_oneway(op->ch, &req);
    }
    free(ids);
}

/* Lays out the leased rows of a reply in one 16-byte aligned buffer: off[i] is row i's
 * place (SIZE_MAX: no bytes: not OK, or its range lies outside the arena of `bytes`,
 * which makes it DATA_LOSS); returns the buffer's size and the count of rows in *n. */
static size_t plan_leased_rows(const Mapflow__V1__GetReply *gr, uint64_t bytes, size_t *off,
                               size_t *n)
{
    size_t total = 0;
    *n = 0;
    for (size_t i = 0; i < gr->n_rows; i++) {
        const Mapflow__V1__RowRef *rr = gr->rows[i];
        off[i] = SIZE_MAX;
        /* gpu_mapped was 0 on these requests: a GPU-tier lease here is the daemon's error */
        if (rr->status != MF_OK || rr->length > MF_ROW_MAX_BYTES ||
            rr->tier == MAPFLOW__V1__TIER__TIER_GPU ||
            rr->arena_offset > bytes || rr->length > bytes - rr->arena_offset)
            continue;
        off[i] = total;
        total += ((size_t)rr->length + 15) & ~(size_t)15;
        (*n)++;
    }
    return total;
}

/*
 * The reply leased the rows where they sit in the daemon's host arena; read them all
 * into one aligned buffer (*copy, the caller's from now on) with the connection's arena
 * ops and release the leases. Copy gets on a mapped arena: one memcpy per row instead of
 * the daemon writing them into the socket and this side reading and copying them again;
 * on UCX: one-sided reads, all in flight at once.
 */
static mf_status_t gather_rows(mf__op_t *op, const Mapflow__V1__GetReply *gr, size_t *off,
                               uint8_t **copy)
{
    const mf__conn_t *c = mf__op_conn(op);
    size_t n;
    size_t total = plan_leased_rows(gr, c->arena_reach, off, &n);
    mf__ucx_rma_t *v = malloc((n ? n : 1) * sizeof(*v));
    *copy = aligned_alloc(16, total ? total : 16);
    mf_status_t st = MF_OK;
    if (!v || !*copy) {
        st = (mf_status_t)mf__op_error(op, MF_RESOURCE_EXHAUSTED, "out of memory");
    } else {
        for (size_t i = 0, k = 0; i < gr->n_rows; i++)
            if (off[i] != SIZE_MAX)
                v[k++] = (mf__ucx_rma_t){gr->rows[i]->arena_offset, *copy + off[i],
                                         gr->rows[i]->length};
        st = c->aops->read(op, v, n);
    }
    free(v);
    release_reply_leases(op, gr);
    if (st != MF_OK) {
        free(*copy);
        *copy = NULL;
    }
    return st;
}

/* Turns a GetReply into an mf_get_result_t; the rows of copy mode (reply payload, or the
 * arena for a batch on an arena channel) and of a UCX channel (read one-sided) are copied
 * into 16-byte aligned memory the result owns. A single-row arena copy (mf_get) keeps
 * pointing into the arena: take_get copies it into the caller's buffer and releases.
 * A row that fails verification becomes DATA_LOSS and its reason the op's message. */
static mf_status_t get_result_build(mf__op_t *op, const mf__reply_t *rep, const get_arg_t *x,
                                    mf_get_result_t **out)
{
    const Mapflow__V1__GetReply *gr = rep->env->get_reply;
    if (gr->n_rows != x->expect_rows)
        return (mf_status_t)mf__op_error(op, MF_INTERNAL, "get reply has %zu rows, expected "
                                         "%zu", gr->n_rows, x->expect_rows);
    const mf__conn_t *c = mf__op_conn(op);
    mf_get_result_t *res = calloc(1, sizeof(*res));
    if (!res)
        return (mf_status_t)mf__op_error(op, MF_RESOURCE_EXHAUSTED, "out of memory");
    res->rows = calloc(gr->n_rows ? gr->n_rows : 1, sizeof(mf_row_ref_t));
    /* rows laid out in one buffer after a one-sided read or a copy out of the arena */
    int remote = c->aops->remote;
    int gathered = remote || (x->arena_copy && x->single == GET_MANY);
    size_t *roff = gathered ? malloc((gr->n_rows ? gr->n_rows : 1) * sizeof(*roff)) : NULL;
    uint8_t *copy = NULL;
    int copy_mode = x->mode == MF_GET_COPY && !remote && !x->arena_copy;
    /* The daemon checksummed every row at commit; HEADER skips doing it again here. */
    unsigned flags = !remote && !copy_mode && op->ch->verify == MF_VERIFY_HEADER
                         ? MF_ROW_NO_CHECKSUM : 0;
    if (copy_mode && rep->payload_len)
        copy = res->priv_ = aligned_alloc(16, ((size_t)rep->payload_len + 15) & ~(size_t)15);
    if (!res->rows || (copy_mode && rep->payload_len && !copy) || (gathered && !roff)) {
        if (gathered)
            release_reply_leases(op, gr);
        free(roff);
        mf_get_result_free(res);
        return (mf_status_t)mf__op_error(op, MF_RESOURCE_EXHAUSTED, "out of memory");
    }
    if (copy)
        memcpy(copy, rep->payload, rep->payload_len);
    if (gathered) {
        mf_status_t st = gather_rows(op, gr, roff, &copy);
        if (st != MF_OK) {
            free(roff);
            mf_get_result_free(res);
            return st;
        }
        res->priv_ = copy;
    }
    res->n_rows = gr->n_rows;
    res->lease_ttl_ms = gr->lease_ttl_ms;
    for (size_t i = 0; i < gr->n_rows; i++) {
        const Mapflow__V1__RowRef *rr = gr->rows[i];
        mf_row_ref_t *r = &res->rows[i];
        r->status = mf_status_valid((int)rr->status) ? (mf_status_t)rr->status : MF_UNKNOWN;
        r->layer = rr->layer;
        r->block = rr->block;
        r->tier = (mf_tier_t)rr->tier;
        /* UCX and arena copies: released after the copy */
        r->lease_id = remote || x->arena_copy ? 0 : rr->lease_id;
        if (r->status != MF_OK)
            continue;
        r->length = rr->length;
        const char *why = "row outside the reply";
        if (!gathered && !copy_mode && rr->tier == MAPFLOW__V1__TIER__TIER_GPU) {
            /* A device view: never read here (the GPU kernels check the header). */
            const mf__gpu_arena_t *a = mf__gpu_find(&c->gpu, rr->gpu_arena);
            uint64_t off = rr->arena_offset;
            if (!a || off % 16 || off > a->bytes || rr->length > a->bytes - off ||
                rr->length > MF_ROW_MAX_BYTES) {
                r->status = a ? MF_DATA_LOSS : MF_FAILED_PRECONDITION;
                mf__op_error(op, r->status, "row %zu (layer %u block %u): %s GPU arena %u", i,
                             r->layer, r->block, a ? "lies outside" : "is in the unmapped",
                             rr->gpu_arena);
                continue;
            }
            r->data = (const void *)(uintptr_t)(a->base + off);
            r->on_device = 1;
            r->gpu_arena = rr->gpu_arena;
            continue;
        }
        if (gathered) {
            if (roff[i] == SIZE_MAX) {
                r->status = MF_DATA_LOSS;
                continue;
            }
            r->data = copy + roff[i];
        } else if (copy_mode) {
            if (rr->payload_offset % 16 || rr->payload_offset > rep->payload_len ||
                rr->length > rep->payload_len - rr->payload_offset) {
                r->status = MF_DATA_LOSS;
                continue;
            }
            r->data = copy + rr->payload_offset;
        } else {
            if (!c->arena || rr->arena_offset % 16 || rr->arena_offset > c->arena_bytes ||
                rr->length > c->arena_bytes - rr->arena_offset) {
                r->status = MF_DATA_LOSS;
                continue;
            }
            r->data = c->arena + rr->arena_offset;
        }
        r->status = verify_row(x, i, r, flags, &why);
        if (r->status != MF_OK) {
            mf__op_error(op, MF_DATA_LOSS, "row %zu (layer %u block %u): %s", i, r->layer,
                         r->block, why);
            r->data = NULL;
        }
    }
    free(roff);
    *out = res;
    return MF_OK;
}

static mf_status_t take_get(mf__op_t *op, const mf__reply_t *rep, void *arg)
{
    get_arg_t *a = arg;
    mf_get_result_t *res = NULL;
    mf_status_t st = get_result_build(op, rep, a, &res);
    if (st != MF_OK) {
        if (a->arena_copy && a->single != GET_MANY)
            release_reply_leases(op, rep->env->get_reply);
        return st;
    }
    if (a->single == GET_MANY) {
        *a->out = res;
        return MF_OK;
    }
    /* One key, one row: the row's own status becomes the call's. */
    mf_row_ref_t *r = &res->rows[0];
    st = r->status;
    if (st == MF_NOT_FOUND)
        mf__op_error(op, st, "no such key");
    else if (st != MF_OK && r->data == NULL && st != MF_DATA_LOSS)
        mf__op_error(op, st, "row: %s", mf_strerror((int)st));
    if (a->single == GET_ONE_COPY && st == MF_OK && r->on_device) {
        st = (mf_status_t)mf__op_error(op, MF_INTERNAL, "a copy came back as a device view");
    } else if (a->single == GET_ONE_COPY && st == MF_OK) {
        *a->len = r->length;
        if (a->cap < r->length || !a->buf)
            st = (mf_status_t)mf__op_error(op, MF_RESOURCE_EXHAUSTED, "row is %zu bytes, "
                                           "buffer %zu", r->length, a->cap);
        else
            memcpy(a->buf, r->data, r->length);
    }
    if (a->arena_copy && a->single == GET_ONE_COPY) {
        release_reply_leases(op, rep->env->get_reply);
    } else if (a->single == GET_ONE_LEASE) {
        a->lease->lease_id = r->lease_id; /* set even on DATA_LOSS, so it can be released */
        a->lease->ttl_ms = res->lease_ttl_ms;
        if (st == MF_OK) {
            a->lease->data = r->data;
            a->lease->length = r->length;
            a->lease->view = r->view;
            a->lease->on_device = r->on_device;
            a->lease->gpu_arena = r->gpu_arena;
        }
    }
    mf_get_result_free(res);
    return st;
}

static mf_status_t check_mode(mf_channel_t *ch, mf_get_mode_t mode)
{
    if (mode != MF_GET_COPY && mode != MF_GET_LEASE)
        return mf__chan_error(ch, MF_INVALID_ARGUMENT, "unknown get mode %d", (int)mode);
    /* UCX: rows are leased, read one-sided into the result and released at once. The
     * daemon leases only to holders of the host arena, GPU rows included (it stages rows
     * of arenas we did not map there). */
    if (mode == MF_GET_LEASE && !mf_channel_has_arena(ch) && !ch->remote)
        return mf__chan_error(ch, MF_FAILED_PRECONDITION, "leased gets need the host arena "
                              "(open the channel on a unix socket with want_arena)");
    return MF_OK;
}

/* Copy gets on a unix channel with the mapped arena lease the rows and copy them out of
 * it (one memcpy, no payload through the socket), then release the leases one-way. */
static int arena_copy_ok(mf_channel_t *ch, mf_get_mode_t mode)
{
    return mode == MF_GET_COPY && !ch->remote && mf_channel_has_arena(ch);
}

/* Get.gpu_mapped: device views only for leases the caller asked for; copies through the
 * host arena have the daemon stage GPU rows there (no device reads on our I/O thread).
 * Fixed when the request is packed: after a reconnect that mapped other arenas, rows of
 * those come back FAILED_PRECONDITION (ask again). */
static uint64_t get_gpu_mapped(mf_channel_t *ch, const get_arg_t *a)
{
    return a->mode == MF_GET_LEASE && !ch->remote ? mf__chan_gpu_mapped(ch) : 0;
}

static mf__op_t *get_prefix_new(mf_channel_t *ch, const char *peer, const char *model,
                                uint32_t block_size,
                                const uint32_t *tokens, size_t n_tokens,
                                const uint32_t *layers, size_t n_layers, uint32_t first_block,
                                uint32_t n_blocks, mf_get_mode_t mode, mf_get_result_t **out,
                                mf_status_t *st)
{
    if (!out) {
        *st = mf__chan_error(ch, MF_INVALID_ARGUMENT, "no result pointer");
        return NULL;
    }
    *out = NULL;
    if ((*st = check_mode(ch, mode)) != MF_OK || (*st = mf__check_model(ch, model)) != MF_OK ||
        (*st = mf__check_peer(ch, peer)) != MF_OK)
        return NULL;
    size_t have_blocks = block_size ? n_tokens / block_size : 0;
    size_t end = n_blocks ? (size_t)first_block + n_blocks : have_blocks;
    if (block_size == 0 || !tokens || !layers || n_layers == 0 || end > have_blocks ||
        end <= first_block) {
        *st = mf__chan_error(ch, MF_INVALID_ARGUMENT, "get needs layers and tokens covering "
                             "blocks [%u, %zu) of %u tokens (have %zu full blocks)",
                             first_block, end, block_size, have_blocks);
        return NULL;
    }
    size_t nt = end * block_size;
    get_arg_t *a = calloc(1, sizeof(*a));
    if (a) {
        a->model = mf__dup_mem(model, strlen(model) + 1);
        a->tokens = mf__dup_mem(tokens, nt * 4);
    }
    if (!a || !a->model || !a->tokens) {
        if (a)
            get_arg_free(a);
        *st = mf__chan_error(ch, MF_RESOURCE_EXHAUSTED, "out of memory");
        return NULL;
    }
    a->mode = mode;
    a->arena_copy = arena_copy_ok(ch, mode);
    a->block_size = block_size;
    a->n_tokens = nt;
    a->expect_rows = n_layers * (end - first_block);
    a->out = out;
    Mapflow__V1__Get g = MAPFLOW__V1__GET__INIT;
    g.model = (char *)model;
    g.block_size = block_size;
    g.n_layers = n_layers;
    g.layers = (uint32_t *)layers;
    g.first_block = first_block;
    g.n_blocks = (uint32_t)(end - first_block);
    g.peer = (char *)(peer ? peer : "");
    g.mode = ch->remote || a->arena_copy ? MAPFLOW__V1__GET_MODE__GET_LEASE
                                         : (Mapflow__V1__GetMode)mode;
    g.gpu_mapped = get_gpu_mapped(ch, a);
    ENV(req, GET, get) = &g;
    *st = MF_RESOURCE_EXHAUSTED;
    return mf__simple_new(ch, &req, a->tokens, nt * 4, MAPFLOW__V1__ENVELOPE__BODY_GET_REPLY,
                          take_get, a, get_arg_free);
}

MF_EXPORT mf_status_t mf_get_prefix(mf_channel_t *ch, const char *model, uint32_t block_size,
                                    const uint32_t *tokens, size_t n_tokens,
                                    const uint32_t *layers, size_t n_layers,
                                    uint32_t first_block, uint32_t n_blocks,
                                    mf_get_mode_t mode, mf_get_result_t **out,
                                    int64_t timeout_ms)
{
    return mf_get_prefix_peer(ch, NULL, model, block_size, tokens, n_tokens, layers, n_layers,
                              first_block, n_blocks, mode, out, timeout_ms);
}

MF_EXPORT mf_status_t mf_get_prefix_async(mf_channel_t *ch, const char *model,
                                          uint32_t block_size, const uint32_t *tokens,
                                          size_t n_tokens, const uint32_t *layers,
                                          size_t n_layers, uint32_t first_block,
                                          uint32_t n_blocks, mf_get_mode_t mode,
                                          mf_get_result_t **out, int64_t timeout_ms,
                                          mf_cq_t *cq, void *tag, mf_call_t **call)
{
    if (!ch)
        return MF_INVALID_ARGUMENT;
    mf_status_t st;
    mf__op_t *op = get_prefix_new(ch, NULL, model, block_size, tokens, n_tokens, layers,
                                  n_layers, first_block, n_blocks, mode, out, &st);
    mf__async_args_t a = {cq, tag, call};
    return mf__run_op(op, st, timeout_ms, &a);
}

MF_EXPORT mf_status_t mf_get_prefix_peer(mf_channel_t *ch, const char *peer, const char *model,
                                         uint32_t block_size, const uint32_t *tokens,
                                         size_t n_tokens, const uint32_t *layers,
                                         size_t n_layers, uint32_t first_block,
                                         uint32_t n_blocks, mf_get_mode_t mode,
                                         mf_get_result_t **out, int64_t timeout_ms)
{
    if (!ch)
        return MF_INVALID_ARGUMENT;
    mf_status_t st;
    mf__op_t *op = get_prefix_new(ch, peer, model, block_size, tokens, n_tokens, layers,
                                  n_layers, first_block, n_blocks, mode, out, &st);
    return mf__run_op(op, st, timeout_ms, NULL);
}

/* Get by keys; `single` picks the one-row forms (mf_get, mf_get_lease). */
static mf__op_t *get_keys_new(mf_channel_t *ch, const char *peer, const mf_key_t *keys,
                              size_t n_keys, mf_get_mode_t mode, get_arg_t *outs,
                              mf_status_t *st)
{
    if ((*st = check_mode(ch, mode)) != MF_OK || (*st = mf__check_peer(ch, peer)) != MF_OK)
        return NULL;
    if (outs->single == GET_ONE_LEASE && ch->remote) {
        *st = mf__chan_error(ch, MF_FAILED_PRECONDITION, "a leased view needs the mapped "
                             "host arena (unix socket); on ucx: use mf_get or mf_get_keys");
        return NULL;
    }
    if (!keys || n_keys == 0 || n_keys > (1u << 20)) {
        *st = mf__chan_error(ch, MF_INVALID_ARGUMENT, "get needs 1..%u keys", 1u << 20);
        return NULL;
    }
    get_arg_t *a = calloc(1, sizeof(*a));
    Mapflow__V1__Key *kpb = malloc(n_keys * sizeof(*kpb));
    Mapflow__V1__Key **kp = malloc(n_keys * sizeof(*kp));
    uint8_t(*hb)[16] = malloc(n_keys * 16);
    size_t models = 0;
    mf__op_t *op = NULL;
    *st = MF_RESOURCE_EXHAUSTED;
    if (!a || !kpb || !kp || !hb)
        goto free_keys;
    for (size_t i = 0; i < n_keys; i++) {
        if ((*st = mf__key_to_pb(ch, &keys[i], &kpb[i], hb[i])) != MF_OK)
            goto free_keys;
        kp[i] = &kpb[i];
        models += strlen(keys[i].model) + 1;
    }
    *st = MF_RESOURCE_EXHAUSTED;
    a->keys = malloc(n_keys * sizeof(*a->keys));
    a->key_models = malloc(models);
    if (!a->keys || !a->key_models)
        goto free_keys;
    for (size_t i = 0, o = 0; i < n_keys; i++) {
        size_t l = strlen(keys[i].model) + 1;
        memcpy(a->key_models + o, keys[i].model, l);
        a->keys[i] = keys[i];
        a->keys[i].model = a->key_models + o;
        o += l;
    }
    a->mode = mode;
    a->arena_copy = arena_copy_ok(ch, mode);
    a->expect_rows = n_keys;
    a->single = outs->single;
    a->out = outs->out;
    a->buf = outs->buf;
    a->cap = outs->cap;
    a->len = outs->len;
    a->lease = outs->lease;
    Mapflow__V1__Get g = MAPFLOW__V1__GET__INIT;
    g.n_keys = n_keys;
    g.keys = kp;
    g.peer = (char *)(peer ? peer : "");
    g.mode = ch->remote || a->arena_copy ? MAPFLOW__V1__GET_MODE__GET_LEASE
                                         : (Mapflow__V1__GetMode)mode;
    g.gpu_mapped = get_gpu_mapped(ch, a);
    ENV(req, GET, get) = &g;
    op = mf__simple_new(ch, &req, NULL, 0, MAPFLOW__V1__ENVELOPE__BODY_GET_REPLY, take_get, a,
                        get_arg_free);
    a = NULL; /* the op owns it now (or freed it) */
free_keys:
    if (a)
        get_arg_free(a);
    if (!op && *st == MF_RESOURCE_EXHAUSTED)
        mf__chan_error(ch, *st, "out of memory");
    free(hb);
    free(kp);
    free(kpb);
    return op;
}

MF_EXPORT mf_status_t mf_get_keys(mf_channel_t *ch, const mf_key_t *keys, size_t n_keys,
                                  mf_get_mode_t mode, mf_get_result_t **out,
                                  int64_t timeout_ms)
{
    return mf_get_keys_peer(ch, NULL, keys, n_keys, mode, out, timeout_ms);
}

MF_EXPORT mf_status_t mf_get_keys_async(mf_channel_t *ch, const mf_key_t *keys,
                                        size_t n_keys, mf_get_mode_t mode,
                                        mf_get_result_t **out, int64_t timeout_ms,
                                        mf_cq_t *cq, void *tag, mf_call_t **call)
{
    if (!ch || !out)
        return MF_INVALID_ARGUMENT;
    *out = NULL;
    get_arg_t o = {.single = GET_MANY, .out = out};
    mf_status_t st;
    mf__op_t *op = get_keys_new(ch, NULL, keys, n_keys, mode, &o, &st);
    mf__async_args_t a = {cq, tag, call};
    return mf__run_op(op, st, timeout_ms, &a);
}

MF_EXPORT mf_status_t mf_get_keys_peer(mf_channel_t *ch, const char *peer,
                                       const mf_key_t *keys, size_t n_keys, mf_get_mode_t mode,
                                       mf_get_result_t **out, int64_t timeout_ms)
{
    if (!ch || !out)
        return MF_INVALID_ARGUMENT;
    *out = NULL;
    get_arg_t o = {.single = GET_MANY, .out = out};
    mf_status_t st;
    mf__op_t *op = get_keys_new(ch, peer, keys, n_keys, mode, &o, &st);
    return mf__run_op(op, st, timeout_ms, NULL);
}

MF_EXPORT void mf_get_result_free(mf_get_result_t *r)
{
    if (!r)
        return;
    free(r->priv_);
    free(r->rows);
    free(r);
}

MF_EXPORT mf_status_t mf_get_result_columns(const mf_get_result_t *r,
                                            const mf_row_columns_t *c)
{
    if (!r || !c || r->n_rows > c->cap || (r->n_rows && !r->rows))
        return MF_INVALID_ARGUMENT;
    /* One pass over the rows (each mf_row_ref_t is read once); absent columns skipped. */
    for (size_t i = 0; i < r->n_rows; i++) {
        const mf_row_ref_t *x = &r->rows[i];
        int ok = x->status == MF_OK;
        if (c->status)
            c->status[i] = (int32_t)x->status;
        if (c->layer)
            c->layer[i] = x->layer;
        if (c->block)
            c->block[i] = x->block;
        if (c->tier)
            c->tier[i] = (int32_t)x->tier;
        if (c->data)
            c->data[i] = ok ? (uint64_t)(uintptr_t)x->data : 0;
        if (c->length)
            c->length[i] = ok ? (uint64_t)x->length : 0;
        if (c->lease_id)
            c->lease_id[i] = x->lease_id;
        if (c->on_device)
            c->on_device[i] = x->on_device ? 1 : 0;
        if (c->gpu_arena)
            c->gpu_arena[i] = x->gpu_arena;
    }
    return MF_OK;
}

MF_EXPORT mf_status_t mf_get(mf_channel_t *ch, const mf_key_t *key, void *buf, size_t cap,
                             size_t *len, int64_t timeout_ms)
{
    if (!ch || !len)
        return MF_INVALID_ARGUMENT;
    get_arg_t o = {.single = GET_ONE_COPY, .buf = buf, .cap = cap, .len = len};
    mf_status_t st;
    mf__op_t *op = get_keys_new(ch, NULL, key, 1, MF_GET_COPY, &o, &st);
    return mf__run_op(op, st, timeout_ms, NULL);
}

MF_EXPORT mf_status_t mf_get_async(mf_channel_t *ch, const mf_key_t *key, void *buf,
                                   size_t cap, size_t *len, int64_t timeout_ms, mf_cq_t *cq,
                                   void *tag, mf_call_t **call)
{
    if (!ch || !len)
        return MF_INVALID_ARGUMENT;
    get_arg_t o = {.single = GET_ONE_COPY, .buf = buf, .cap = cap, .len = len};
    mf_status_t st;
    mf__op_t *op = get_keys_new(ch, NULL, key, 1, MF_GET_COPY, &o, &st);
    mf__async_args_t a = {cq, tag, call};
    return mf__run_op(op, st, timeout_ms, &a);
}

MF_EXPORT mf_status_t mf_get_lease(mf_channel_t *ch, const mf_key_t *key, mf_lease_t *out,
                                   int64_t timeout_ms)
{
    if (!ch || !out)
        return MF_INVALID_ARGUMENT;
    memset(out, 0, sizeof(*out));
    get_arg_t o = {.single = GET_ONE_LEASE, .lease = out};
    mf_status_t st;
    mf__op_t *op = get_keys_new(ch, NULL, key, 1, MF_GET_LEASE, &o, &st);
    return mf__run_op(op, st, timeout_ms, NULL);
}
