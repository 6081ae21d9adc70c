/*
 * calls — libmapflow's data calls: put (two-phase, single and batched), lookup, get
 * (copy / lease, by prefix or by key), release, delete, each in a sync and an async
 * form. Declared and documented in mapflow.h. Each call checks its arguments in the
 * caller's thread, builds an operation (channel.h) holding copies of what it needs, and
 * runs it: mf__op_run waits for it, mf__op_run_async posts its event to a queue.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "channel.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "libmapflow sends token arrays as they sit in memory: little-endian hosts only"
#endif

/* Sync and async entry points share the op builder: run it or post it. */
typedef struct async_args {
    mf_cq_t *cq;
    void *tag;
    mf_call_t **call;
} async_args_t;

static mf_status_t run_op(mf__op_t *op, mf_status_t st, int64_t timeout_ms,
                          const async_args_t *a)
{
    if (!op)
        return st;
    return a ? mf__op_run_async(op, timeout_ms, a->cq, a->tag, a->call)
             : mf__op_run(op, timeout_ms);
}

static size_t model_len_ok(const char *model)
{
    size_t ml = model ? strlen(model) : 0;
    return ml == 0 || ml > MF_ROW_MAX_MODEL ? 0 : ml;
}

static mf_status_t check_model(mf_channel_t *ch, const char *model)
{
    if (!model_len_ok(model))
        return mf__chan_error(ch, MF_INVALID_ARGUMENT, "model id must be 1..%d bytes",
                              MF_ROW_MAX_MODEL);
    return MF_OK;
}

/* A peer daemon's UCX listener for read-through (NULL or "" = none). */
static mf_status_t check_peer(mf_channel_t *ch, const char *peer)
{
    if (peer && (strlen(peer) > 255 || (peer[0] && !strchr(peer, ':'))))
        return mf__chan_error(ch, MF_INVALID_ARGUMENT, "peer must be HOST:PORT (at most 255 "
                              "bytes)");
    return MF_OK;
}

/* Fills a protobuf Key from an mf_key_t; hb holds the 16 hash bytes it points to. */
static mf_status_t key_to_pb(mf_channel_t *ch, const mf_key_t *key, Mapflow__V1__Key *pb,
                             uint8_t hb[16])
{
    mf_status_t st = check_model(ch, key ? key->model : NULL);
    if (st != MF_OK)
        return st;
    mapflow__v1__key__init(pb);
    mf_hash_to_le(key->hash, hb);
    pb->model = (char *)key->model;
    pb->layer = key->layer;
    pb->hash.data = hb;
    pb->hash.len = 16;
    return MF_OK;
}

static void *dup_mem(const void *p, size_t n)
{
    void *d = malloc(n ? n : 1);
    if (d && n)
        memcpy(d, p, n);
    return d;
}

/* ==== put ============================================================================ */

typedef struct put {
    const void *row;            /* caller's; valid until completion (device memory when
                                 * on_device) */
    size_t len;
    int on_device;              /* mf_put_device: row is a device address */
    uint8_t head[MF_ROW_HEADER]; /* the row's first bytes (checked after a GPU write) */
    uint8_t *stage;             /* on_device: the row copied to host memory, when needed */
    char model[MF_ROW_MAX_MODEL + 1];
    uint32_t layer;
    mf_hash128_t hash;
    int durable;
    mf_put_result_t *res;       /* may be NULL */
    mf_status_t *status_out;    /* batch item status */
    int stage_n;                /* 0: PutBegin sent, 1: PutCommit sent */
    uint64_t reservation;       /* held on connection res_gen */
    uint32_t res_gen;
} put_t;

/* Validates the row as the daemon will and extracts its key. */
static mf_status_t put_key_of(const void *row, size_t len, put_t *p, char *err, size_t errlen)
{
    if (!row || len == 0 || len > MF_ROW_MAX_BYTES) {
        snprintf(err, errlen, "empty or oversized row");
        return MF_INVALID_ARGUMENT;
    }
    const void *buf = row;
    void *tmp = NULL;
    if ((uintptr_t)row % MF_ROW_ALIGN) { /* the decoder needs 16-byte alignment */
        tmp = aligned_alloc(MF_ROW_ALIGN, (len + MF_ROW_ALIGN - 1) & ~(size_t)15);
        if (!tmp) {
            snprintf(err, errlen, "out of memory");
            return MF_RESOURCE_EXHAUSTED;
        }
        memcpy(tmp, row, len);
        buf = tmp;
    }
    mf_row_view_t v;
    const char *why = "";
    mf_status_t st = mf_row_decode(buf, len, 0, &v, &why);
    if (st == MF_OK) {
        memcpy(p->model, v.model, v.model_len);
        p->model[v.model_len] = '\0';
        p->layer = v.layer;
        p->hash = v.hash;
    } else {
        snprintf(err, errlen, "row rejected before sending: %s", why);
    }
    free(tmp);
    return st;
}

/*
 * Reads the header and model of a row in device memory and checks what can be checked
 * without the rest (magic, version, size, model length); the daemon validates the whole
 * row, checksum included, at commit.
 */
static mf_status_t put_key_of_device(mf_channel_t *ch, const void *row, size_t len, put_t *p,
                                     char *err, size_t errlen)
{
    if (!row || len < MF_ROW_HEADER || len > MF_ROW_MAX_BYTES || (uintptr_t)row % MF_ROW_ALIGN) {
        snprintf(err, errlen, "device row: NULL, not 16-byte aligned, shorter than its header "
                 "or oversized");
        return MF_INVALID_ARGUMENT;
    }
    uint8_t buf[MF_ROW_HEADER + MF_ROW_MAX_MODEL];
    size_t n = len < sizeof(buf) ? len : sizeof(buf);
    mf_status_t st = mf__gpu_copy(ch->gpu, MF__DTOH, (uintptr_t)buf, (uintptr_t)row, n, err,
                                  errlen);
    if (st != MF_OK)
        return st;
    mf_row_header_t h;
    memcpy(&h, buf, sizeof(h));
    if (h.magic != MF_ROW_MAGIC || h.version != MF_ROW_VERSION || h.total_size != len ||
        h.model_len == 0 || MF_ROW_HEADER + (size_t)h.model_len > n) {
        snprintf(err, errlen, "device row rejected before sending: bad magic, version, size "
                 "(header says %u, given %zu) or model length", h.total_size, len);
        return MF_INVALID_ARGUMENT;
    }
    memcpy(p->head, buf, MF_ROW_HEADER);
    memcpy(p->model, buf + MF_ROW_HEADER, h.model_len);
    p->model[h.model_len] = '\0';
    p->layer = h.layer;
    p->hash = mf_hash_from_le(h.hash);
    return MF_OK;
}

/* The row in host memory: the caller's, or (device rows) a copy made once. */
static mf_status_t put_host_row(mf__op_t *op, const void **out)
{
    put_t *p = op->priv;
    if (!p->on_device) {
        *out = p->row;
        return MF_OK;
    }
    if (!p->stage) {
        p->stage = aligned_alloc(MF_ROW_ALIGN, (p->len + 15) & ~(size_t)15);
        if (!p->stage)
            return (mf_status_t)mf__op_error(op, MF_RESOURCE_EXHAUSTED, "out of memory");
        mf_status_t st = mf__gpu_copy(op->ch->gpu, MF__DTOH, (uintptr_t)p->stage,
                                      (uintptr_t)p->row, p->len, op->err, sizeof(op->err));
        if (st != MF_OK) {
            free(p->stage);
            p->stage = NULL;
            return st;
        }
    }
    *out = p->stage;
    return MF_OK;
}

static mf_status_t put_start(mf__op_t *op)
{
    put_t *p = op->priv;
    p->stage_n = 0;
    p->reservation = 0;
    uint8_t hb[16];
    Mapflow__V1__Key kpb = MAPFLOW__V1__KEY__INIT;
    mf_hash_to_le(p->hash, hb);
    kpb.model = p->model;
    kpb.layer = p->layer;
    kpb.hash.data = hb;
    kpb.hash.len = 16;
    Mapflow__V1__PutBegin pb = MAPFLOW__V1__PUT_BEGIN__INIT;
    pb.key = &kpb;
    pb.size = p->len;
    pb.durable = p->durable;
    /* Rows on the device ask for the gpu tier; host rows take the daemon's placement. We
     * copy into the GPU arenas we mapped ourselves; the daemon copies into the others. */
    pb.want_tier = p->on_device ? MAPFLOW__V1__TIER__TIER_GPU : MAPFLOW__V1__TIER__TIER_NONE;
    mf__do_gpu_want(op->ch, &pb.gpu_mapped, &pb.gpu_arena);
    ENV(req, PUT_BEGIN, put_begin) = &pb;
    return mf__op_pack(op, &req, NULL, 0, MAPFLOW__V1__ENVELOPE__BODY_PUT_BEGIN_REPLY);
}

static int put_step(mf__op_t *op, const mf__reply_t *rep)
{
    put_t *p = op->priv;
    if (p->stage_n == 1) {
        p->reservation = 0; /* committed: nothing to abort */
        if (p->res) {
            p->res->tier = (mf_tier_t)rep->env->put_commit_reply->tier;
            p->res->durable = rep->env->put_commit_reply->durable;
            p->res->replaced = rep->env->put_commit_reply->replaced;
        }
        return MF_OK;
    }
    const Mapflow__V1__PutBeginReply *br = rep->env->put_begin_reply;
    p->reservation = br->reservation_id;
    p->res_gen = op->gen;
    p->stage_n = 1;
    Mapflow__V1__PutCommit pc = MAPFLOW__V1__PUT_COMMIT__INIT;
    pc.reservation_id = br->reservation_id;
    ENV(creq, PUT_COMMIT, put_commit) = &pc;
    const void *payload = NULL;
    size_t plen = 0;
    const mf__conn_t *c = mf__op_conn(op);
    uint64_t off = br->arena_offset;
    mf_status_t st = MF_OK;
    if (br->in_arena && br->tier == MAPFLOW__V1__TIER__TIER_GPU) {
        /* Only arenas we named in gpu_mapped come back in_arena on the gpu tier. */
        const mf__gpu_arena_t *a = mf__gpu_find(&c->gpu, br->gpu_arena);
        if (!a || off % MF_ROW_ALIGN || off > a->bytes || p->len > a->bytes - off)
            return mf__op_error(op, MF_INTERNAL, "daemon reserved bytes [%llu, +%zu) of GPU "
                                "arena %u, %s", (unsigned long long)off, p->len, br->gpu_arena,
                                a ? "outside it" : "which this process did not map");
        st = mf__gpu_write_row(op->ch->gpu, a->base + off, p->row, p->on_device, p->len,
                               p->head, sizeof(p->head), op->err, sizeof(op->err));
    } else if (br->in_arena) {
        if (off % MF_ROW_ALIGN || off > c->arena_reach || p->len > c->arena_reach - off)
            return mf__op_error(op, MF_INTERNAL, "daemon reserved arena bytes [%llu, +%zu) "
                                "outside its arena", (unsigned long long)off, p->len);
        st = c->aops->write(op, off, p->row, p->len, p->on_device);
    } else {
        st = put_host_row(op, &payload);
        plen = p->len;
    }
    if (st != MF_OK)
        return (int)st;
    st = mf__op_pack(op, &creq, payload, plen, MAPFLOW__V1__ENVELOPE__BODY_PUT_COMMIT_REPLY);
    return st == MF_OK ? MF__CONTINUE : (int)st;
}

/* Best effort: the daemon also frees a reservation at its TTL or when we disconnect;
 * the reply (or NOT_FOUND when the commit already freed it) is dropped. Lock held. */
static void put_undo(mf__op_t *op)
{
    put_t *p = op->priv;
    if (p->reservation && op->ch->gen == p->res_gen) {
        Mapflow__V1__PutAbort pa = MAPFLOW__V1__PUT_ABORT__INIT;
        pa.reservation_id = p->reservation;
        ENV(areq, PUT_ABORT, put_abort) = &pa;
        mf__do_send_oneway(op->ch, &areq);
    }
    p->reservation = 0;
}

static void put_destroy(mf__op_t *op)
{
    put_t *p = op->priv;
    free(p->stage);
    free(p);
}

static const mf__op_vt_t put_vt = {put_start, put_step, put_undo, put_destroy};

static mf__op_t *put_new(mf_channel_t *ch, const void *row, size_t len, unsigned flags,
                         int on_device, mf_put_result_t *res, mf_status_t *st)
{
    char err[MF__ERR_LEN];
    put_t *p = calloc(1, sizeof(*p));
    if (!p) {
        *st = mf__chan_error(ch, MF_RESOURCE_EXHAUSTED, "out of memory");
        return NULL;
    }
    if (on_device && !mf__gpu_usable(ch->gpu)) {
        *st = mf__chan_error(ch, MF_FAILED_PRECONDITION, "device rows need a channel opened "
                             "with a usable gpu_device: %s",
                             ch->gpu ? ch->gpu->why : "none given");
        free(p);
        return NULL;
    }
    *st = on_device ? put_key_of_device(ch, row, len, p, err, sizeof(err))
                    : put_key_of(row, len, p, err, sizeof(err));
    if (*st == MF_OK && !on_device)
        memcpy(p->head, row, MF_ROW_HEADER); /* decoded: at least a header long */
    if (*st != MF_OK) {
        mf__chan_error(ch, *st, "%s", err);
        free(p);
        return NULL;
    }
    mf__op_t *op = mf__op_new(ch, &put_vt, p);
    if (!op) {
        free(p);
        *st = mf__chan_error(ch, MF_RESOURCE_EXHAUSTED, "out of memory");
        return NULL;
    }
    p->row = row;
    p->len = len;
    p->on_device = on_device;
    p->durable = (flags & MF_PUT_DURABLE) != 0;
    p->res = res;
    return op;
}

MF_EXPORT mf_status_t mf_put(mf_channel_t *ch, const void *row, size_t len, unsigned flags,
                             mf_put_result_t *res, int64_t timeout_ms)
{
    if (!ch)
        return MF_INVALID_ARGUMENT;
    mf_status_t st;
    mf__op_t *op = put_new(ch, row, len, flags, 0, res, &st);
    return run_op(op, st, timeout_ms, NULL);
}

MF_EXPORT mf_status_t mf_put_async(mf_channel_t *ch, const void *row, size_t len,
                                   unsigned flags, mf_put_result_t *res, int64_t timeout_ms,
                                   mf_cq_t *cq, void *tag, mf_call_t **call)
{
    if (!ch)
        return MF_INVALID_ARGUMENT;
    mf_status_t st;
    mf__op_t *op = put_new(ch, row, len, flags, 0, res, &st);
    async_args_t a = {cq, tag, call};
    return run_op(op, st, timeout_ms, &a);
}

static void put_kid_done(mf__op_t *kid)
{
    put_t *p = kid->priv;
    *p->status_out = kid->status;
}

/* A group of one put per item; every row validated before anything is sent. */
static mf__op_t *put_batch_new(mf_channel_t *ch, mf_put_item_t *items, size_t n,
                               unsigned flags, int on_device, mf_status_t *st)
{
    if (!items || n == 0 || n > MF_PUT_BATCH_MAX) {
        *st = mf__chan_error(ch, MF_INVALID_ARGUMENT, "put batch needs 1..%u items",
                             MF_PUT_BATCH_MAX);
        return NULL;
    }
    for (size_t i = 0; i < n; i++)
        items[i].status = MF_ABORTED; /* not attempted (yet) */
    mf__op_t *g = mf__group_new(ch, n, NULL, NULL);
    if (!g) {
        *st = MF_RESOURCE_EXHAUSTED;
        return NULL;
    }
    g->group_kid_done = put_kid_done;
    for (size_t i = 0; i < n; i++) {
        memset(&items[i].result, 0, sizeof(items[i].result));
        mf__op_t *k = put_new(ch, items[i].row, items[i].len, flags, on_device,
                              &items[i].result, st);
        if (!k) {
            items[i].status = *st;
            char msg[MF__ERR_LEN];
            snprintf(msg, sizeof(msg), "%s", mf_channel_last_error(ch));
            mf__chan_error(ch, *st, "item %zu: %s", i, msg);
            mf__op_unref(g);
            return NULL;
        }
        ((put_t *)k->priv)->status_out = &items[i].status;
        k->weight = items[i].len;
        mf__group_add(g, k);
    }
    return g;
}

MF_EXPORT mf_status_t mf_put_batch(mf_channel_t *ch, mf_put_item_t *items, size_t n,
                                   unsigned flags, int64_t timeout_ms)
{
    if (!ch)
        return MF_INVALID_ARGUMENT;
    mf_status_t st;
    mf__op_t *g = put_batch_new(ch, items, n, flags, 0, &st);
    return run_op(g, st, timeout_ms, NULL);
}

MF_EXPORT mf_status_t mf_put_batch_async(mf_channel_t *ch, mf_put_item_t *items, size_t n,
                                         unsigned flags, int64_t timeout_ms, mf_cq_t *cq,
                                         void *tag, mf_call_t **call)
{
    if (!ch)
        return MF_INVALID_ARGUMENT;
    mf_status_t st;
    mf__op_t *g = put_batch_new(ch, items, n, flags, 0, &st);
    async_args_t a = {cq, tag, call};
    return run_op(g, st, timeout_ms, &a);
}

MF_EXPORT mf_status_t mf_put_device(mf_channel_t *ch, const void *dev_row, size_t len,
                                    unsigned flags, mf_put_result_t *res, int64_t timeout_ms)
{
    if (!ch)
        return MF_INVALID_ARGUMENT;
    mf_status_t st;
    mf__op_t *op = put_new(ch, dev_row, len, flags, 1, res, &st);
    return run_op(op, st, timeout_ms, NULL);
}

MF_EXPORT mf_status_t mf_put_device_batch(mf_channel_t *ch, mf_put_item_t *items, size_t n,
                                          unsigned flags, int64_t timeout_ms)
{
    if (!ch)
        return MF_INVALID_ARGUMENT;
    mf_status_t st;
    mf__op_t *g = put_batch_new(ch, items, n, flags, 1, &st);
    return run_op(g, st, timeout_ms, NULL);
}

/* ==== lookup ========================================================================= */

typedef struct lookup_arg {
    uint32_t *tokens;           /* copy: the payload */
    size_t n_layers;
    uint32_t *blocks;
    uint32_t *total_blocks;
} lookup_arg_t;

static void lookup_free(void *arg)
{
    lookup_arg_t *a = arg;
    free(a->tokens);
    free(a);
}

static mf_status_t take_lookup(mf__op_t *op, const mf__reply_t *rep, void *arg)
{
    lookup_arg_t *a = arg;
    const Mapflow__V1__LookupReply *lr = rep->env->lookup_reply;
    if (lr->n_blocks != a->n_layers)
        return (mf_status_t)mf__op_error(op, MF_INTERNAL, "lookup reply has %zu layers, "
                                         "asked %zu", lr->n_blocks, a->n_layers);
    memcpy(a->blocks, lr->blocks, a->n_layers * sizeof(uint32_t));
    if (a->total_blocks)
        *a->total_blocks = lr->total_blocks;
    return MF_OK;
}

static mf__op_t *lookup_new(mf_channel_t *ch, const char *peer, const char *model,
                            uint32_t block_size, const uint32_t *tokens, size_t n_tokens,
                            const uint32_t *layers, size_t n_layers, uint32_t *blocks,
                            uint32_t *total_blocks, mf_status_t *st)
{
    if ((*st = check_model(ch, model)) != MF_OK || (*st = check_peer(ch, peer)) != MF_OK)
        return NULL;
    if (block_size == 0 || (n_tokens && !tokens) || n_layers == 0 || !layers || !blocks) {
        *st = mf__chan_error(ch, MF_INVALID_ARGUMENT, "lookup needs block_size > 0, tokens "
                             "and at least one layer");
        return NULL;
    }
    size_t full = n_tokens - n_tokens % block_size; /* only full blocks count */
    lookup_arg_t *a = calloc(1, sizeof(*a));
    if (a)
        a->tokens = dup_mem(tokens, full * 4);
    if (!a || !a->tokens) {
        free(a);
        *st = mf__chan_error(ch, MF_RESOURCE_EXHAUSTED, "out of memory");
        return NULL;
    }
    a->n_layers = n_layers;
    a->blocks = blocks;
    a->total_blocks = total_blocks;
    Mapflow__V1__Lookup lk = MAPFLOW__V1__LOOKUP__INIT;
    lk.model = (char *)model;
    lk.block_size = block_size;
    lk.n_layers = n_layers;
    lk.layers = (uint32_t *)layers;
    lk.peer = (char *)(peer ? peer : "");
    ENV(req, LOOKUP, lookup) = &lk;
    *st = MF_RESOURCE_EXHAUSTED;
    return mf__simple_new(ch, &req, a->tokens, full * 4,
                          MAPFLOW__V1__ENVELOPE__BODY_LOOKUP_REPLY, take_lookup, a,
                          lookup_free);
}

MF_EXPORT mf_status_t mf_lookup(mf_channel_t *ch, const char *model, uint32_t block_size,
                                const uint32_t *tokens, size_t n_tokens,
                                const uint32_t *layers, size_t n_layers, uint32_t *blocks,
                                uint32_t *total_blocks, int64_t timeout_ms)
{
    return mf_lookup_peer(ch, NULL, model, block_size, tokens, n_tokens, layers, n_layers,
                          blocks, total_blocks, timeout_ms);
}

MF_EXPORT mf_status_t mf_lookup_async(mf_channel_t *ch, const char *model, uint32_t block_size,
                                      const uint32_t *tokens, size_t n_tokens,
                                      const uint32_t *layers, size_t n_layers,
                                      uint32_t *blocks, uint32_t *total_blocks,
                                      int64_t timeout_ms, mf_cq_t *cq, void *tag,
                                      mf_call_t **call)
{
    if (!ch)
        return MF_INVALID_ARGUMENT;
    mf_status_t st;
    mf__op_t *op = lookup_new(ch, NULL, model, block_size, tokens, n_tokens, layers, n_layers,
                              blocks, total_blocks, &st);
    async_args_t a = {cq, tag, call};
    return run_op(op, st, timeout_ms, &a);
}

MF_EXPORT mf_status_t mf_lookup_peer(mf_channel_t *ch, const char *peer, const char *model,
                                     uint32_t block_size, const uint32_t *tokens,
                                     size_t n_tokens, const uint32_t *layers, size_t n_layers,
                                     uint32_t *blocks, uint32_t *total_blocks,
                                     int64_t timeout_ms)
{
    if (!ch)
        return MF_INVALID_ARGUMENT;
    mf_status_t st;
    mf__op_t *op = lookup_new(ch, peer, model, block_size, tokens, n_tokens, layers, n_layers,
                              blocks, total_blocks, &st);
    return run_op(op, st, timeout_ms, NULL);
}

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
    if ((*st = check_mode(ch, mode)) != MF_OK || (*st = check_model(ch, model)) != MF_OK ||
        (*st = check_peer(ch, peer)) != MF_OK)
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
        a->model = dup_mem(model, strlen(model) + 1);
        a->tokens = dup_mem(tokens, nt * 4);
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
    async_args_t a = {cq, tag, call};
    return run_op(op, st, timeout_ms, &a);
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
    return run_op(op, st, timeout_ms, NULL);
}

/* Get by keys; `single` picks the one-row forms (mf_get, mf_get_lease). */
static mf__op_t *get_keys_new(mf_channel_t *ch, const char *peer, const mf_key_t *keys,
                              size_t n_keys, mf_get_mode_t mode, get_arg_t *outs,
                              mf_status_t *st)
{
    if ((*st = check_mode(ch, mode)) != MF_OK || (*st = check_peer(ch, peer)) != MF_OK)
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
        if ((*st = key_to_pb(ch, &keys[i], &kpb[i], hb[i])) != MF_OK)
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
    async_args_t a = {cq, tag, call};
    return run_op(op, st, timeout_ms, &a);
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
    return run_op(op, st, timeout_ms, NULL);
}

MF_EXPORT void mf_get_result_free(mf_get_result_t *r)
{
    if (!r)
        return;
    free(r->priv_);
    free(r->rows);
    free(r);
}

MF_EXPORT mf_status_t mf_get(mf_channel_t *ch, const mf_key_t *key, void *buf, size_t cap,
                             size_t *len, int64_t timeout_ms)
{
    if (!ch || !len)
        return MF_INVALID_ARGUMENT;
    get_arg_t o = {.single = GET_ONE_COPY, .buf = buf, .cap = cap, .len = len};
    mf_status_t st;
    mf__op_t *op = get_keys_new(ch, NULL, key, 1, MF_GET_COPY, &o, &st);
    return run_op(op, st, timeout_ms, NULL);
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
    async_args_t a = {cq, tag, call};
    return run_op(op, st, timeout_ms, &a);
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
    return run_op(op, st, timeout_ms, NULL);
}

/* ==== release, delete ================================================================ */

static mf_status_t take_release(mf__op_t *op, const mf__reply_t *rep, void *arg)
{
    (void)op;
    if (arg)
        *(uint32_t *)arg = rep->env->release_reply->released;
    return MF_OK;
}

static mf__op_t *release_new(mf_channel_t *ch, const uint64_t *ids, size_t n,
                             uint32_t *released, mf_status_t *st)
{
    Mapflow__V1__Release rl = MAPFLOW__V1__RELEASE__INIT;
    rl.n_lease_ids = n;
    rl.lease_ids = (uint64_t *)ids;
    ENV(req, RELEASE, release) = &rl;
    *st = MF_RESOURCE_EXHAUSTED;
    return mf__simple_new(ch, &req, NULL, 0, MAPFLOW__V1__ENVELOPE__BODY_RELEASE_REPLY,
                          take_release, released, NULL);
}

MF_EXPORT mf_status_t mf_release(mf_channel_t *ch, const uint64_t *lease_ids, size_t n,
                                 uint32_t *released, int64_t timeout_ms)
{
    if (!ch || (n && !lease_ids))
        return MF_INVALID_ARGUMENT;
    mf_status_t st;
    mf__op_t *op = release_new(ch, lease_ids, n, released, &st);
    return run_op(op, st, timeout_ms, NULL);
}

MF_EXPORT mf_status_t mf_release_async(mf_channel_t *ch, const uint64_t *lease_ids, size_t n,
                                       uint32_t *released, int64_t timeout_ms, mf_cq_t *cq,
                                       void *tag, mf_call_t **call)
{
    if (!ch || (n && !lease_ids))
        return MF_INVALID_ARGUMENT;
    mf_status_t st;
    mf__op_t *op = release_new(ch, lease_ids, n, released, &st);
    async_args_t a = {cq, tag, call};
    return run_op(op, st, timeout_ms, &a);
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
    mf_status_t st = n ? mf_release(ch, ids, n, NULL, timeout_ms) : MF_OK;
    if (st == MF_OK)
        for (size_t i = 0; i < r->n_rows; i++)
            r->rows[i].lease_id = 0;
    free(ids);
    return st;
}

static mf_status_t take_delete(mf__op_t *op, const mf__reply_t *rep, void *arg)
{
    (void)op;
    if (arg)
        *(uint64_t *)arg = rep->env->delete_reply->deleted;
    return MF_OK;
}

static mf__op_t *delete_new(mf_channel_t *ch, const mf_key_t *key, const char *model,
                            int64_t layer, uint64_t *deleted, mf_status_t *st)
{
    uint8_t hb[16];
    Mapflow__V1__Key kpb;
    Mapflow__V1__Delete d = MAPFLOW__V1__DELETE__INIT;
    if (key) {
        if ((*st = key_to_pb(ch, key, &kpb, hb)) != MF_OK)
            return NULL;
        d.key = &kpb;
    } else {
        if ((*st = check_model(ch, model)) != MF_OK)
            return NULL;
        d.model = (char *)model;
        d.has_layer = layer >= 0;
        d.layer = layer >= 0 ? (uint32_t)layer : 0;
    }
    ENV(req, DELETE, delete_) = &d;
    *st = MF_RESOURCE_EXHAUSTED;
    return mf__simple_new(ch, &req, NULL, 0, MAPFLOW__V1__ENVELOPE__BODY_DELETE_REPLY,
                          take_delete, deleted, NULL);
}

MF_EXPORT mf_status_t mf_delete(mf_channel_t *ch, const mf_key_t *key, uint64_t *deleted,
                                int64_t timeout_ms)
{
    if (!ch)
        return MF_INVALID_ARGUMENT;
    mf_status_t st;
    mf__op_t *op = delete_new(ch, key ? key : &(mf_key_t){0}, NULL, -1, deleted, &st);
    return run_op(op, st, timeout_ms, NULL);
}

MF_EXPORT mf_status_t mf_delete_async(mf_channel_t *ch, const mf_key_t *key,
                                      uint64_t *deleted, int64_t timeout_ms, mf_cq_t *cq,
                                      void *tag, mf_call_t **call)
{
    if (!ch)
        return MF_INVALID_ARGUMENT;
    mf_status_t st;
    mf__op_t *op = delete_new(ch, key ? key : &(mf_key_t){0}, NULL, -1, deleted, &st);
    async_args_t a = {cq, tag, call};
    return run_op(op, st, timeout_ms, &a);
}

MF_EXPORT mf_status_t mf_delete_model(mf_channel_t *ch, const char *model, int64_t layer,
                                      uint64_t *deleted, int64_t timeout_ms)
{
    if (!ch)
        return MF_INVALID_ARGUMENT;
    mf_status_t st;
    mf__op_t *op = delete_new(ch, NULL, model, layer, deleted, &st);
    return run_op(op, st, timeout_ms, NULL);
}
