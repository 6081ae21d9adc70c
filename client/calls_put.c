/*
 * calls_put — mf_put, mf_put_device, mf_put_batch (sync and async): PutBegin reserves
 * space, the row goes into the arena through the connection's arena ops (or rides as the
 * frame payload), PutCommit makes the daemon validate and link it; a failed attempt
 * aborts its reservation. See calls.c for the shape every call has; runs its steps on the
 * channel's I/O thread.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "channel.h"
#include "calls_internal.h"

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
    return mf__run_op(op, st, timeout_ms, NULL);
}

MF_EXPORT mf_status_t mf_put_async(mf_channel_t *ch, const void *row, size_t len,
                                   unsigned flags, mf_put_result_t *res, int64_t timeout_ms,
                                   mf_cq_t *cq, void *tag, mf_call_t **call)
{
    if (!ch)
        return MF_INVALID_ARGUMENT;
    mf_status_t st;
    mf__op_t *op = put_new(ch, row, len, flags, 0, res, &st);
    mf__async_args_t a = {cq, tag, call};
    return mf__run_op(op, st, timeout_ms, &a);
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
    return mf__run_op(g, st, timeout_ms, NULL);
}

MF_EXPORT mf_status_t mf_put_batch_async(mf_channel_t *ch, mf_put_item_t *items, size_t n,
                                         unsigned flags, int64_t timeout_ms, mf_cq_t *cq,
                                         void *tag, mf_call_t **call)
{
    if (!ch)
        return MF_INVALID_ARGUMENT;
    mf_status_t st;
    mf__op_t *g = put_batch_new(ch, items, n, flags, 0, &st);
    mf__async_args_t a = {cq, tag, call};
    return mf__run_op(g, st, timeout_ms, &a);
}

MF_EXPORT mf_status_t mf_put_device(mf_channel_t *ch, const void *dev_row, size_t len,
                                    unsigned flags, mf_put_result_t *res, int64_t timeout_ms)
{
    if (!ch)
        return MF_INVALID_ARGUMENT;
    mf_status_t st;
    mf__op_t *op = put_new(ch, dev_row, len, flags, 1, res, &st);
    return mf__run_op(op, st, timeout_ms, NULL);
}

MF_EXPORT mf_status_t mf_put_device_batch(mf_channel_t *ch, mf_put_item_t *items, size_t n,
                                          unsigned flags, int64_t timeout_ms)
{
    if (!ch)
        return MF_INVALID_ARGUMENT;
    mf_status_t st;
    mf__op_t *g = put_batch_new(ch, items, n, flags, 1, &st);
    return mf__run_op(g, st, timeout_ms, NULL);
}

/* ==== put regions ===================================================================== */

enum { REGION_OPEN = 0, REGION_COMMITTED, REGION_ABORTED, REGION_BEGINNING };

struct mf_put_region {
    mf_channel_t *ch;
    uint64_t id;
    uint32_t gen;               /* the connection it lives on */
    uint32_t arena;
    int state;
    int caps;                   /* len are capacities: commit sends act */
    size_t n;
    size_t *len;
    uint64_t *act;              /* caps: the actual lengths (mf_put_region_set_lengths) */
    void **dev;                 /* row i's address in the channel's device context */
};

/* The daemon forgets region id (lock held): a one-way abort on its connection. */
static void region_forget(mf_channel_t *ch, uint32_t gen, uint64_t id)
{
    if (ch->gen != gen)
        return; /* that connection is gone, and the region with it */
    Mapflow__V1__PutRegionAbort pa = MAPFLOW__V1__PUT_REGION_ABORT__INIT;
    pa.region_id = id;
    ENV(areq, PUT_REGION_ABORT, put_region_abort) = &pa;
    mf__do_send_oneway(ch, &areq);
}

static mf_status_t take_region_begin(mf__op_t *op, const mf__reply_t *rep, void *arg)
{
    mf_put_region_t *r = arg;
    const Mapflow__V1__PutRegionBeginReply *br = rep->env->put_region_begin_reply;
    const mf__gpu_arena_t *a = mf__gpu_find(&mf__op_conn(op)->gpu, br->gpu_arena);
    const char *bad = !a || !a->base ? "an arena this process did not map"
                      : br->n_row_offsets != r->n ? "a different number of rows"
                                                  : NULL;
    for (size_t i = 0; !bad && i < r->n; i++) {
        uint64_t off = br->row_offsets[i];
        if (off % MF_ROW_ALIGN || off > a->bytes || r->len[i] > a->bytes - off)
            bad = "row offsets outside the arena or misaligned";
        else
            r->dev[i] = (void *)(uintptr_t)(a->base + off);
    }
    if (bad) {
        pthread_mutex_lock(&op->ch->mu);
        region_forget(op->ch, op->gen, br->region_id);
        pthread_mutex_unlock(&op->ch->mu);
        return (mf_status_t)mf__op_error(op, MF_INTERNAL, "PutRegionBeginReply names %s "
                                         "(arena %u)", bad, br->gpu_arena);
    }
    r->id = br->region_id;
    r->gen = op->gen;
    r->arena = br->gpu_arena;
    r->state = REGION_OPEN;
    return MF_OK;
}

MF_EXPORT mf_status_t mf_put_region_begin(mf_channel_t *ch, const char *model, uint32_t layer,
                                          const size_t *lens, size_t n, unsigned flags,
                                          const mf_put_region_params_t *params,
                                          void **dev_rows, mf_put_region_t **out,
                                          int64_t timeout_ms)
{
    if (!ch)
        return MF_INVALID_ARGUMENT;
    mf_status_t st;
    if (!out)
        return mf__chan_error(ch, MF_INVALID_ARGUMENT, "put region: out is NULL");
    *out = NULL;
    if ((st = mf__check_model(ch, model)) != MF_OK)
        return st;
    if (flags & MF_PUT_DURABLE)
        return mf__chan_error(ch, MF_INVALID_ARGUMENT, "put regions are not durable; put "
                              "durable rows with mf_put_device_batch");
    if (!lens || n == 0 || n > MF_PUT_BATCH_MAX)
        return mf__chan_error(ch, MF_INVALID_ARGUMENT, "put region needs 1..%u row lengths",
                              MF_PUT_BATCH_MAX);
    for (size_t i = 0; i < n; i++)
        if (lens[i] < MF_ROW_HEADER || lens[i] > MF_ROW_MAX_BYTES)
            return mf__chan_error(ch, MF_INVALID_ARGUMENT, "put region: row %zu is %zu bytes "
                                  "(want %u..%u)", i, lens[i], MF_ROW_HEADER, MF_ROW_MAX_BYTES);
    if (!mf__gpu_usable(ch->gpu))
        return mf__chan_error(ch, MF_FAILED_PRECONDITION, "put regions need a channel opened "
                              "with a usable gpu_device: %s; put the rows with "
                              "mf_put_device_batch", ch->gpu ? ch->gpu->why : "none given");
    mf_put_region_t *r = calloc(1, sizeof(*r));
    uint64_t *wl = malloc(n * sizeof(*wl));
    if (r) {
        r->len = malloc(n * sizeof(*r->len));
        r->dev = calloc(n, sizeof(*r->dev));
    }
    if (!r || !wl || !r->len || !r->dev) {
        free(wl);
        mf_put_region_free(r);
        return mf__chan_error(ch, MF_RESOURCE_EXHAUSTED, "out of memory");
    }
    r->ch = ch;
    r->n = n;
    r->state = REGION_BEGINNING;
    r->caps = params && (params->field_mask & MF_PUT_REGION_PARAM_CAPACITIES) &&
              params->capacities;
    for (size_t i = 0; i < n; i++)
        wl[i] = r->len[i] = lens[i];
    Mapflow__V1__PutRegionBegin pb = MAPFLOW__V1__PUT_REGION_BEGIN__INIT;
    pb.model = (char *)model;
    pb.layer = layer;
    pb.lengths = wl;
    pb.n_lengths = n;
    pthread_mutex_lock(&ch->mu);
    mf__do_gpu_want(ch, &pb.gpu_mapped, &pb.gpu_arena);
    pthread_mutex_unlock(&ch->mu);
    if (params && (params->field_mask & MF_PUT_REGION_PARAM_GPU_ARENA))
        pb.gpu_arena = params->gpu_arena + 1;
    pb.capacities = r->caps;
    ENV(req, PUT_REGION_BEGIN, put_region_begin) = &pb;
    mf__op_t *op = mf__simple_new(ch, &req, NULL, 0,
                                  MAPFLOW__V1__ENVELOPE__BODY_PUT_REGION_BEGIN_REPLY,
                                  take_region_begin, r, NULL);
    free(wl);
    st = op ? MF_OK : MF_RESOURCE_EXHAUSTED;
    st = mf__run_op(op, st, timeout_ms, NULL);
    if (st != MF_OK || r->state != REGION_OPEN) {
        mf_put_region_free(r);
        return st != MF_OK ? st : MF_INTERNAL;
    }
    if (dev_rows)
        memcpy(dev_rows, r->dev, n * sizeof(*dev_rows));
    *out = r;
    return MF_OK;
}

MF_EXPORT void *mf_put_region_row(const mf_put_region_t *r, size_t i)
{
    return r && i < r->n ? r->dev[i] : NULL;
}

MF_EXPORT size_t mf_put_region_rows(const mf_put_region_t *r)
{
    return r ? r->n : 0;
}

MF_EXPORT mf_status_t mf_put_region_set_lengths(mf_put_region_t *r, const size_t *lens,
                                                size_t n)
{
    if (!r)
        return MF_INVALID_ARGUMENT;
    if (r->state != REGION_OPEN)
        return mf__chan_error(r->ch, MF_FAILED_PRECONDITION, "put region lengths: the region "
                              "was already %s", r->state == REGION_COMMITTED ? "committed"
                                                                              : "aborted");
    if (!r->caps)
        return mf__chan_error(r->ch, MF_INVALID_ARGUMENT, "put region lengths: the region was "
                              "begun with exact lengths (MF_PUT_REGION_PARAM_CAPACITIES)");
    if (!lens || n != r->n)
        return mf__chan_error(r->ch, MF_INVALID_ARGUMENT, "put region lengths: %zu for a "
                              "region of %zu rows", lens ? n : 0, r->n);
    for (size_t i = 0; i < n; i++)
        if (lens[i] < MF_ROW_HEADER || lens[i] > r->len[i])
            return mf__chan_error(r->ch, MF_INVALID_ARGUMENT, "put region lengths: row %zu "
                                  "is %zu bytes (want %u..%zu, its capacity)", i, lens[i],
                                  MF_ROW_HEADER, r->len[i]);
    if (!r->act && !(r->act = malloc(n * sizeof(*r->act))))
        return mf__chan_error(r->ch, MF_RESOURCE_EXHAUSTED, "out of memory");
    for (size_t i = 0; i < n; i++)
        r->act[i] = lens[i];
    return MF_OK;
}

typedef struct region_commit_arg {
    mf_put_region_t *r;
    mf_status_t *statuses;      /* caller's, may be NULL */
    mf_put_region_result_t *res; /* caller's, may be NULL */
} region_commit_arg_t;

static mf_status_t take_region_commit(mf__op_t *op, const mf__reply_t *rep, void *arg)
{
    region_commit_arg_t *a = arg;
    const Mapflow__V1__PutRegionCommitReply *cr = rep->env->put_region_commit_reply;
    size_t n = a->r->n;
    a->r->state = REGION_COMMITTED; /* the daemon forgot it, whatever the rows' fate */
    if (cr->n_status != n || cr->committed > n || (cr->committed < n && cr->first_failed >= n))
        return (mf_status_t)mf__op_error(op, MF_INTERNAL, "PutRegionCommitReply: %zu "
                                         "statuses for %zu rows", cr->n_status, n);
    if (a->res)
        *a->res = (mf_put_region_result_t){cr->committed, cr->replaced,
                                           cr->committed < n ? cr->first_failed : n,
                                           cr->checked_on_gpu};
    for (size_t i = 0; a->statuses && i < n; i++)
        a->statuses[i] = mf_status_valid((int)cr->status[i]) ? (mf_status_t)cr->status[i]
                                                              : MF_UNKNOWN;
    if (cr->committed == n)
        return MF_OK;
    int st = (int)cr->status[cr->first_failed];
    return (mf_status_t)mf__op_error(op, st && mf_status_valid(st) ? (mf_status_t)st
                                                                   : MF_UNKNOWN,
                                     "%s", cr->first_error);
}

/* A region handle that can still be committed or aborted: MF_OK, or why not. */
static mf_status_t region_usable(mf_put_region_t *r, const char *what)
{
    if (r->state != REGION_OPEN)
        return mf__chan_error(r->ch, MF_FAILED_PRECONDITION, "%s: the region was already %s",
                              what, r->state == REGION_COMMITTED ? "committed" : "aborted");
    pthread_mutex_lock(&r->ch->mu);
    int gone = r->ch->gen != r->gen;
    pthread_mutex_unlock(&r->ch->mu);
    if (gone) {
        r->state = REGION_ABORTED;
        return mf__chan_error(r->ch, MF_ABORTED, "%s: the connection the region was begun on "
                              "is gone (the daemon freed it); put the rows again", what);
    }
    return MF_OK;
}

/* The commit op of r (NULL: out of memory, message in the channel). */
static mf__op_t *region_commit_new(mf_put_region_t *r, mf_status_t *statuses,
                                   mf_put_region_result_t *res)
{
    region_commit_arg_t *a = malloc(sizeof(*a));
    if (!a) {
        mf__chan_error(r->ch, MF_RESOURCE_EXHAUSTED, "out of memory");
        return NULL;
    }
    *a = (region_commit_arg_t){r, statuses, res};
    if (res)
        *res = (mf_put_region_result_t){0, 0, r->n, 0};
    Mapflow__V1__PutRegionCommit pc = MAPFLOW__V1__PUT_REGION_COMMIT__INIT;
    pc.region_id = r->id;
    pc.lengths = r->act;
    pc.n_lengths = r->act ? r->n : 0;
    ENV(req, PUT_REGION_COMMIT, put_region_commit) = &pc;
    return mf__simple_new(r->ch, &req, NULL, 0,
                          MAPFLOW__V1__ENVELOPE__BODY_PUT_REGION_COMMIT_REPLY,
                          take_region_commit, a, free);
}

/* Commits r synchronously (a NULL) or as an async call on a->cq. */
static mf_status_t region_commit_run(mf_put_region_t *r, mf_status_t *statuses,
                                     mf_put_region_result_t *res, int64_t timeout_ms,
                                     const mf__async_args_t *a)
{
    if (!r)
        return MF_INVALID_ARGUMENT;
    mf_status_t st = region_usable(r, "put region commit");
    if (st != MF_OK)
        return st;
    if (r->caps && !r->act)
        return mf__chan_error(r->ch, MF_FAILED_PRECONDITION, "put region commit: the region "
                              "was begun with capacities: set the rows' actual lengths first "
                              "(mf_put_region_set_lengths)");
    mf__op_t *op = region_commit_new(r, statuses, res);
    return mf__run_op(op, MF_RESOURCE_EXHAUSTED, timeout_ms, a);
}

MF_EXPORT mf_status_t mf_put_region_commit(mf_put_region_t *r, mf_status_t *statuses,
                                           mf_put_region_result_t *res, int64_t timeout_ms)
{
    return region_commit_run(r, statuses, res, timeout_ms, NULL);
}

MF_EXPORT mf_status_t mf_put_region_commit_async(mf_put_region_t *r, mf_status_t *statuses,
                                                 mf_put_region_result_t *res,
                                                 int64_t timeout_ms, mf_cq_t *cq, void *tag,
                                                 mf_call_t **call)
{
    mf__async_args_t a = {cq, tag, call};
    return region_commit_run(r, statuses, res, timeout_ms, &a);
}

MF_EXPORT mf_status_t mf_put_region_abort(mf_put_region_t *r, int64_t timeout_ms)
{
    if (!r)
        return MF_INVALID_ARGUMENT;
    mf_status_t st = region_usable(r, "put region abort");
    if (st != MF_OK)
        return st;
    r->state = REGION_ABORTED;
    Mapflow__V1__PutRegionAbort pa = MAPFLOW__V1__PUT_REGION_ABORT__INIT;
    pa.region_id = r->id;
    ENV(req, PUT_REGION_ABORT, put_region_abort) = &pa;
    mf__op_t *op = mf__simple_new(r->ch, &req, NULL, 0,
                                  MAPFLOW__V1__ENVELOPE__BODY_PUT_REGION_ABORT_REPLY, NULL,
                                  NULL, NULL);
    return mf__run_op(op, op ? MF_OK : MF_RESOURCE_EXHAUSTED, timeout_ms, NULL);
}

MF_EXPORT void mf_put_region_free(mf_put_region_t *r)
{
    if (!r)
        return;
    if (r->state == REGION_OPEN) {
        pthread_mutex_lock(&r->ch->mu);
        region_forget(r->ch, r->gen, r->id);
        pthread_mutex_unlock(&r->ch->mu);
    }
    free(r->len);
    free(r->act);
    free(r->dev);
    free(r);
}
