/*
 * calls — libmapflow's data calls: put (two-phase, single and batched: calls_put.c),
 * lookup, get (copy / lease, by prefix or by key: calls_get.c), release, delete, each in a
 * sync and an async form. Declared and documented in mapflow.h. Each call checks its
 * arguments in the caller's thread, builds an operation (channel.h) holding copies of
 * what it needs, and runs it: mf__op_run waits for it, mf__op_run_async posts its event
 * to a queue. This file: the shared checks (calls_internal.h), lookup, release, delete.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "channel.h"
#include "calls_internal.h"

mf_status_t mf__run_op(mf__op_t *op, mf_status_t st, int64_t timeout_ms,
                       const mf__async_args_t *a)
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

mf_status_t mf__check_model(mf_channel_t *ch, const char *model)
{
    if (!model_len_ok(model))
        return mf__chan_error(ch, MF_INVALID_ARGUMENT, "model id must be 1..%d bytes",
                              MF_ROW_MAX_MODEL);
    return MF_OK;
}

/* A peer daemon's UCX listener for read-through (NULL or "" = none). */
mf_status_t mf__check_peer(mf_channel_t *ch, const char *peer)
{
    if (peer && (strlen(peer) > 255 || (peer[0] && !strchr(peer, ':'))))
        return mf__chan_error(ch, MF_INVALID_ARGUMENT, "peer must be HOST:PORT (at most 255 "
                              "bytes)");
    return MF_OK;
}

/* Fills a protobuf Key from an mf_key_t; hb holds the 16 hash bytes it points to. */
mf_status_t mf__key_to_pb(mf_channel_t *ch, const mf_key_t *key, Mapflow__V1__Key *pb,
                          uint8_t hb[16])
{
    mf_status_t st = mf__check_model(ch, key ? key->model : NULL);
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

void *mf__dup_mem(const void *p, size_t n)
{
    void *d = malloc(n ? n : 1);
    if (d && n)
        memcpy(d, p, n);
    return d;
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
    if ((*st = mf__check_model(ch, model)) != MF_OK || (*st = mf__check_peer(ch, peer)) != MF_OK)
        return NULL;
    if (block_size == 0 || (n_tokens && !tokens) || n_layers == 0 || !layers || !blocks) {
        *st = mf__chan_error(ch, MF_INVALID_ARGUMENT, "lookup needs block_size > 0, tokens "
                             "and at least one layer");
        return NULL;
    }
    size_t full = n_tokens - n_tokens % block_size; /* only full blocks count */
    lookup_arg_t *a = calloc(1, sizeof(*a));
    if (a)
        a->tokens = mf__dup_mem(tokens, full * 4);
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
    mf__async_args_t a = {cq, tag, call};
    return mf__run_op(op, st, timeout_ms, &a);
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
    return mf__run_op(op, st, timeout_ms, NULL);
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
    return mf__run_op(op, st, timeout_ms, NULL);
}

MF_EXPORT mf_status_t mf_release_async(mf_channel_t *ch, const uint64_t *lease_ids, size_t n,
                                       uint32_t *released, int64_t timeout_ms, mf_cq_t *cq,
                                       void *tag, mf_call_t **call)
{
    if (!ch || (n && !lease_ids))
        return MF_INVALID_ARGUMENT;
    mf_status_t st;
    mf__op_t *op = release_new(ch, lease_ids, n, released, &st);
    mf__async_args_t a = {cq, tag, call};
    return mf__run_op(op, st, timeout_ms, &a);
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
        if ((*st = mf__key_to_pb(ch, key, &kpb, hb)) != MF_OK)
            return NULL;
        d.key = &kpb;
    } else {
        if ((*st = mf__check_model(ch, model)) != MF_OK)
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
    return mf__run_op(op, st, timeout_ms, NULL);
}

MF_EXPORT mf_status_t mf_delete_async(mf_channel_t *ch, const mf_key_t *key,
                                      uint64_t *deleted, int64_t timeout_ms, mf_cq_t *cq,
                                      void *tag, mf_call_t **call)
{
    if (!ch)
        return MF_INVALID_ARGUMENT;
    mf_status_t st;
    mf__op_t *op = delete_new(ch, key ? key : &(mf_key_t){0}, NULL, -1, deleted, &st);
    mf__async_args_t a = {cq, tag, call};
    return mf__run_op(op, st, timeout_ms, &a);
}

MF_EXPORT mf_status_t mf_delete_model(mf_channel_t *ch, const char *model, int64_t layer,
                                      uint64_t *deleted, int64_t timeout_ms)
{
    if (!ch)
        return MF_INVALID_ARGUMENT;
    mf_status_t st;
    mf__op_t *op = delete_new(ch, NULL, model, layer, deleted, &st);
    return mf__run_op(op, st, timeout_ms, NULL);
}
